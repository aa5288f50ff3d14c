"""Notifications: signed webhooks, the gate that decides what is sent, sinks and the worker.

`sign` and `verify` are public: a receiver checks a webhook's signature with them.
"""

from trainguard.notify.signing import sign, verify

__all__ = ["gate", "notifier", "sign", "signing", "sinks", "verify"]
