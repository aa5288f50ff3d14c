"""The AIMaster argument string (R-POL-4), read as it is written for that system.

`--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=3 ...`
becomes the `fault_tolerance` mapping of a job spec; validation happens there.
"""

from __future__ import annotations

import shlex
from typing import Any

from trainguard.errors import SpecError
from trainguard.spec.fields import AIMASTER
from trainguard.spec.text import shown

FLAGS: dict[str, str] = {name: row.name for name, row in AIMASTER.items()}
"""AIMaster flag -> FaultTolerance field, from spec.fields (adding a flag is a row there)."""

_BOOL_FIELDS = {field for name, field in FLAGS.items() if name.startswith("enable-")}


def _bool(flag: str, value: str) -> bool:
    low = value.strip().lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise SpecError([f"--ft-args --{flag}: must be True or False, got {shown(value)}"])


def parse_ft_args(text: str) -> dict[str, Any]:
    """Map an AIMaster argument string onto fault_tolerance fields."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise SpecError([f"--ft-args: cannot split {shown(text)} ({exc})"]) from None
    out: dict[str, Any] = {}
    problems: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            problems.append(f"--ft-args: expected --name=value, got {shown(token)}")
            continue
        name, sep, value = token[2:].partition("=")
        if not sep:
            if i < len(tokens) and not tokens[i].startswith("--"):
                value = tokens[i]
                i += 1
            elif name.startswith("enable-"):
                value = "True"
            else:
                problems.append(f"--ft-args --{name}: needs a value")
                continue
        field = FLAGS.get(name)
        if field is None:
            known = ", ".join(f"--{f}" for f in FLAGS)
            problems.append(f"--ft-args --{name}: unknown option (known: {known})")
            continue
        try:
            out[field] = _bool(name, value) if field in _BOOL_FIELDS else value
        except SpecError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SpecError(problems)
    return out
