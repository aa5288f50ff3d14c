"""The service: the queue scheduler, its quota policy, the HTTP API and its guard (and the
token challenge the CLI checks), metrics, the server's configuration and the web page.
"""

__all__ = ["api", "challenge", "config", "http_guard", "metrics", "quota", "scheduler", "server"]
