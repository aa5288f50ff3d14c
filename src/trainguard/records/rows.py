"""Typed rows of the store that other modules read for their logic (issue 15).

A `JobRow` has exactly the columns of the `jobs` table (a test holds them together);
modules read attributes that mypy checks, not string keys. `as_dict` gives the plain
mapping where a row leaves the process (JSON for the API and `--json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class JobRow:
    id: str
    name: str
    spec_json: str
    state: str
    created_at_s: float
    ended_at_s: float | None
    attempts: int
    error_code: str | None
    error_message: str | None
    master_pid: int | None
    master_host: str | None
    master_started_ticks: int | None
    log_dir: str
    cwd: str | None
    last_step: int | None
    last_metrics_json: str | None
    last_progress_s: float | None
    origin: str | None
    priority: int | None
    queued_reason: str | None
    queued_at_s: float | None

    @classmethod
    def of(cls, mapping: Any) -> JobRow:
        return cls(**{f.name: mapping[f.name] for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
