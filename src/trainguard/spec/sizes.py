"""Sizes as people write them in specs and flags: `4Gi`, `512M`, `2GB`, `1024`."""

from __future__ import annotations

import re

from trainguard.spec.text import shown

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS |= {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_memory(text: str) -> int:
    """`4Gi` -> bytes; `512M`, `2GB`, `1024` too. A ValueError names a bad size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    if not m:
        raise ValueError(f"not a size such as 4Gi or 512M: {shown(text)}")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])
