"""Where a job's progress comes from when its training code does not report it (issue 20):
the replicas' own output, read by built-in recognisers or by the user's pattern."""

from __future__ import annotations

from typing import Any, Literal

import re2  # type: ignore[import-untyped]
from pydantic import field_validator, model_validator

from trainguard.spec.base import SpecModel
from trainguard.spec.limits import MAX_PATTERN_CHARS


class ProgressOptions(SpecModel):
    """`progress: auto` (default) reads what popular trainers print; `off` reads nothing;
    `progress: {pattern: 'it (?P<step>\\d+) loss (?P<loss>\\S+)'}` reads only that (a
    string that is neither keyword is a pattern). SDK reports always come first."""

    read: Literal["auto", "off"] = "auto"
    # RE2 (case-insensitive), searched in every output line: a named group `step` (an
    # integer) and optional named groups of numbers (`loss`, `lr`, ...) as metrics.
    pattern: str | None = None
    # Whose output: default the job's first rank (the one most trainers print from).
    replica: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            word = data.strip().lower()
            return {"read": word} if word in ("auto", "off") else {"pattern": data}
        return data

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip() or len(value) > MAX_PATTERN_CHARS:
            raise ValueError(f"must be a regex of 1 to {MAX_PATTERN_CHARS} characters")
        compile_progress_pattern(value)
        return value


def compile_progress_pattern(text: str) -> Any:
    """The pattern in RE2 (linear time on any line), or a ValueError that says what is wrong."""
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # RE2 would print to stderr
    try:
        compiled = re2.compile(text, options)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise ValueError(f"is not a regex RE2 accepts ({why}): '{text}'") from None
    if "step" not in compiled.groupindex:
        raise ValueError(f"needs a named group for the step, (?P<step>\\d+): '{text}'")
    return compiled
