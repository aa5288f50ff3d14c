"""The AIMaster argument string (R-POL-4), read as it is written for that system.

`--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=3 ...`
becomes the `fault_tolerance` mapping of a job spec; validation happens there.
"""

from __future__ import annotations

import shlex
from typing import Any

from trainguard.errors import SpecError
from trainguard.spec.text import shown

# AIMaster flag -> FaultTolerance field. Adding a flag is one line here.
FLAGS: dict[str, str] = {
    "job-execution-mode": "execution_mode",
    "enable-job-restart": "enable_job_restart",
    "max-num-of-job-restart": "max_num_of_job_restart",
    "fault-tolerant-policy": "fault_tolerant_policy",
    "max-num-of-same-error": "max_num_of_same_error",
    "max-tolerated-failure-rate": "max_tolerated_failure_rate",
    "enable-job-hang-detection": "enable_job_hang_detection",
    "job-hang-interval": "job_hang_interval",
    "enable-job-exit-hang-detection": "enable_job_exit_hang_detection",
    "job-exit-hang-interval": "job_exit_hang_interval",
    "enable-c4d-hang-detection": "enable_c4d_hang_detection",
}

_BOOL_FIELDS = {f for f in FLAGS.values() if f.startswith("enable_")}


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
