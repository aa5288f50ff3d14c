"""Bounds on what a spec may ask for, and budgets that may be unlimited.

A value past these bounds is a typo, not a setting: it is refused with a line that says
so rather than accepted and overflowing a timer or a counter later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from trainguard.spec.text import shown

UNLIMITED: Literal["unlimited"] = "unlimited"
"""The explicit spelling of "no limit" for a budget; -1 on input means the same."""

MAX_LIMIT = 10**9
"""A budget above this is a typo: 'unlimited' says "no limit"."""
MAX_SECONDS = 10**7
"""About 115 days: a longer interval is a typo (and overflows the event loop's timers)."""
MAX_REPLICAS = 4096
"""Replicas of one job, in all its pools."""
MAX_PATTERNS = 100
"""A job's own retryable patterns (the spec's and `--retryable-error`'s), in all."""
MAX_PATTERN_CHARS = 1000
"""A user's regex (retryable or progress) longer than this is a mistake, not a pattern."""
MIN_WATCH_S = 0.5
"""A hang or start-up interval below this would fire on a healthy replica's scheduling
jitter: it is a typo (milliseconds meant as seconds), not a setting."""


def _limit(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("unlimited", "-1", "inf"):
            return UNLIMITED
        if text.isdigit() and int(text) <= MAX_LIMIT:
            return int(text)
    elif isinstance(value, int) and not isinstance(value, bool):
        if value == -1:
            return UNLIMITED
        if 0 <= value <= MAX_LIMIT:
            return value
    shown = value if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
    raise ValueError(
        f"must be a whole number from 0 to {MAX_LIMIT}, or 'unlimited' (or -1), got {shown!r}"
    )


Limit = Annotated[int | Literal["unlimited"], BeforeValidator(_limit)]


def limit_allows(limit: int | Literal["unlimited"], used: int) -> bool:
    """True if a budget with `limit` that has `used` charges can take one more."""
    return limit == UNLIMITED or used < limit


def pattern_problems(patterns: Sequence[str], field: str) -> list[str]:
    """What is wrong with a job's own retryable patterns, a line each: each one is searched
    in every line of a failed replica's tail, so they are a few, short, and not blank.
    `field` names them: a spec path (lines say which item) or a flag."""
    if len(patterns) > MAX_PATTERNS:
        return [f"{field}: at most {MAX_PATTERNS} patterns, got {len(patterns)}"]
    problems = []
    for i, text in enumerate(patterns):
        where = field if field.startswith("--") else f"{field}[{i}]"
        if len(text) > MAX_PATTERN_CHARS:
            problems.append(f"{where}: at most {MAX_PATTERN_CHARS} characters, got {shown(text)}")
        elif not text.strip():
            problems.append(f"{where}: is blank, so it would match every line")
    return problems
