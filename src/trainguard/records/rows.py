"""Typed rows of the store (issue 15): one frozen dataclass per table.

Each has exactly its table's columns, in order (tests/unit/test_rows.py holds them together);
modules read attributes that mypy checks, not string keys. `as_dict` gives the plain
mapping where a row leaves the process (JSON for the API and `--json`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Self


@dataclass(frozen=True)
class _Row:
    @classmethod
    def of(cls, mapping: Any) -> Self:
        """From a result row's mapping (a column it lacks is an error, not a None)."""
        return cls(**{f.name: mapping[f.name] for f in fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobRow(_Row):
    """A row of `jobs`."""

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
    starter_pid: int | None
    starter_host: str | None
    starter_started_ticks: int | None
    cancel_requested_at_s: float | None


@dataclass(frozen=True)
class AttemptRow(_Row):
    """A row of `attempts`."""

    job_id: str
    number: int
    started_at_s: float
    ended_at_s: float | None
    master_addr: str | None
    master_port: int | None
    outcome: str | None
    reason: str | None


@dataclass(frozen=True)
class RunRow(_Row):
    """A row of `replica_runs`."""

    id: int
    job_id: str
    attempt: int
    replica: str
    rank: int
    restart: int
    pid: int | None
    node: str | None
    state: str
    exit_code: int | None
    signal: str | None
    failure_class: str | None
    rule: str | None
    message: str | None
    stop_requested: bool
    started_at_s: float
    ended_at_s: float | None
    log_path: str | None
    fingerprint: str | None
    tail: str | None


@dataclass(frozen=True)
class TransitionRow(_Row):
    """A row of `transitions`."""

    id: int
    job_id: str
    from_state: str | None
    to_state: str
    at_s: float
    reason: str | None


@dataclass(frozen=True)
class RestartRow(_Row):
    """A row of `restart_records`."""

    id: int
    job_id: str
    round: int
    at_s: float
    node: str | None
    replica: str | None
    error_code: str | None
    error_message: str | None
    error_source: str | None
    failure_class: str | None
    rule: str | None
    decision: str | None
    detect_ms: float | None
    stop_ms: float | None
    schedule_ms: float | None
    start_ms: float | None
    first_output_ms: float | None
    fingerprint: str | None
    matched_line: str | None
    cascade: str | None
    snapshot_id: int | None
    isolated: str | None


@dataclass(frozen=True)
class StackDumpRow(_Row):
    """A row of `stack_snapshots` (a hang's stack dumps; the table keeps its first name)."""

    id: int
    job_id: str
    attempt: int
    at_s: float
    kind: str
    culprits: str | None
    summary: str | None
    duration_ms: float | None
    report_json: str
    snapshots_json: str


@dataclass(frozen=True)
class ProgressRow(_Row):
    """A row of `progress`."""

    id: int
    job_id: str
    attempt: int
    step: int
    at_s: float
    checkpoint: str | None
    commit_ms: float | None


@dataclass(frozen=True)
class EventRow(_Row):
    """A row of `events`."""

    id: int
    job_id: str
    at_s: float
    replica: str | None
    kind: str
    text: str | None


@dataclass(frozen=True)
class FailureRow(_Row):
    """A row of `failure_records`."""

    id: int
    job_id: str
    attempt: int
    replica: str
    at_s: float
    exit_code: int | None
    signal: str | None
    failure_class: str | None
    retryable: bool | None
    rule: str | None
    matched_line: str | None
    fingerprint: str | None
    message: str | None
    root_cause: bool
    cascade_of: str | None
    decision: str | None
    confidence: float | None
    phase: str | None
    step: int | None
    notes: str | None
    machine: str | None


@dataclass(frozen=True)
class NodeEventRow(_Row):
    """A row of `node_events` (the node ledger)."""

    id: int
    node: str
    kind: str
    at_s: float
    job_id: str | None
    attempt: int | None
    replica: str | None
    failure_class: str | None
    rule: str | None
    matched_line: str | None
    reason: str | None
    backend: str | None
