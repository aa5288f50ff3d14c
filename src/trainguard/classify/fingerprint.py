"""A normalised fingerprint of an error line, so "the same error" can be counted.

Numbers, addresses, IPs, ports, paths and ranks are folded: `Connection reset by peer
[10.0.0.3]:29500` on rank 3 and on rank 5 are the same error; a KeyError on 'lr' and
one on 'momentum' are not (quoted strings are kept).
"""

from __future__ import annotations

import hashlib
import re

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"0x[0-9a-fA-F]+"), "<hex>"),
    (re.compile(r"\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b"), "<ip>"),
    (re.compile(r"\[?[0-9a-fA-F]*:[0-9a-fA-F:]+\]:\d+"), "<ip>"),
    (re.compile(r"(?<![\w<])(/[\w.@+-]+)+/?"), "<path>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def normalise(text: str) -> str:
    out = text.strip()
    for pattern, repl in _RULES:
        out = pattern.sub(repl, out)
    return out[:300]


def fingerprint(text: str) -> str:
    """A short stable id of the normalised text."""
    return hashlib.sha1(normalise(text).encode()).hexdigest()[:12]
