"""Webhook signatures: `X-Trainguard-Signature: sha256=<hex HMAC-SHA256 of the body>`.

A receiver checks one with `trainguard.notify.verify(secret, body, header)`.
"""

from __future__ import annotations

import hashlib
import hmac

EVENT_HEADER = "X-Trainguard-Event"
SIGNATURE_HEADER = "X-Trainguard-Signature"


def sign(secret: str, body: bytes) -> str:
    """The signature header value for `body`: "sha256=" + hex HMAC-SHA256 keyed by `secret`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True if `header` signs exactly `body` with `secret` (constant-time, for receivers)."""
    if not header:
        return False
    return hmac.compare_digest(
        sign(secret, body).encode(), header.strip().encode("utf-8", "replace")
    )
