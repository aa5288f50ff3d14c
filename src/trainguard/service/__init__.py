"""The service: the queue scheduler, its quota policy, the HTTP API and its guard, metrics, the
server"s configuration and the web page.
"""

__all__ = ["api", "config", "http_guard", "metrics", "quota", "scheduler", "server"]
