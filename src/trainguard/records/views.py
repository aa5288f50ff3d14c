"""What a job looks like to a reader (CLI `--json`, and later the HTTP API): plain dicts."""

from __future__ import annotations

import json
from typing import Any

from trainguard.records.rows import JobRow, RunRow
from trainguard.records.store import Store


def job_view(store: Store, job: JobRow) -> dict[str, Any]:
    job_id = job.id
    runs = store.runs_of(job_id)
    last_attempt = max((r.attempt for r in runs), default=0)
    latest: dict[str, RunRow] = {}
    for r in runs:
        if r.attempt == last_attempt:
            latest[r.replica] = r  # the last run of each replica wins
    restarts = store.restarts_of(job_id)
    metrics = job.last_metrics_json
    return {
        "id": job_id,
        "name": job.name,
        "state": job.state,
        "attempts": job.attempts,
        "restarts": len(restarts),
        "error_code": job.error_code,
        "error_message": job.error_message,
        "created_at_s": job.created_at_s,
        "ended_at_s": job.ended_at_s,
        "master_pid": job.master_pid,
        "log_dir": job.log_dir,
        "origin": job.origin,
        "priority": job.priority,
        "queued_reason": job.queued_reason,
        "progress": {
            "step": job.last_step,
            "metrics": json.loads(metrics) if metrics else None,
            "at_s": job.last_progress_s,
        },
        "spec": json.loads(job.spec_json),
        "replicas": [
            {
                "name": r.replica,
                "rank": r.rank,
                "attempt": r.attempt,
                "restart": r.restart,
                "state": r.state,
                "pid": r.pid,
                "node": r.node,
                "exit_code": r.exit_code,
                "signal": r.signal,
                "failure_class": r.failure_class,
                "started_at_s": r.started_at_s,
                "ended_at_s": r.ended_at_s,
                "log_path": r.log_path,
            }
            for r in sorted(latest.values(), key=lambda r: r.rank)
        ],
    }


_SUMMARY = (
    "id",
    "name",
    "state",
    "attempts",
    "created_at_s",
    "ended_at_s",
    "error_code",
    "error_message",
    "queued_reason",
    "last_step",
)


def job_summary(job: JobRow) -> dict[str, Any]:
    row = job.as_dict()
    return {k: row[k] for k in _SUMMARY}
