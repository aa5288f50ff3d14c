"""What readers ask about jobs, as plain data: the CLI prints it, the HTTP API sends it.

One function per question, so `trainguard status --json` here and `GET /api/jobs/ID` on a
server give the same shape. `Reader` is the seam: the store here, or a server over HTTP.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

from trainguard.errors import JobNotFound
from trainguard.records.explain import EXPLAINED_EVENTS, aggregate
from trainguard.records.goodput import goodput
from trainguard.records.store import Store
from trainguard.records.views import job_summary, job_view

MAX_LOG_BYTES = 4 * 1024 * 1024  # a log request answers with at most the last 4 MiB


class Reader(Protocol):
    def jobs(self, limit: int) -> list[dict[str, Any]]: ...
    def status(self, ref: str) -> dict[str, Any]: ...
    def records(self, ref: str, aggregate: bool) -> list[dict[str, Any]]: ...
    def explain(self, ref: str) -> dict[str, Any]: ...
    def stacks(self, ref: str, attempt: int | None) -> list[dict[str, Any]]: ...
    def goodput(self, ref: str) -> dict[str, Any]: ...
    def log(
        self, ref: str, replica: str | None, attempt: int | None, tail: int | None
    ) -> dict[str, Any]: ...


class StoreReader:
    """The answers, read from a store on this machine."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def jobs(self, limit: int) -> list[dict[str, Any]]:
        return [job_summary(j) for j in self.store.list_jobs(limit)]

    def status(self, ref: str) -> dict[str, Any]:
        return job_view(self.store, self.store.resolve_job(ref))

    def records(self, ref: str, aggregate_: bool) -> list[dict[str, Any]]:
        job = self.store.resolve_job(ref)
        if aggregate_:
            return aggregate(self.store.failures_of(job.id))
        return [r.as_dict() for r in self.store.restarts_of(job.id)]

    def explain(self, ref: str) -> dict[str, Any]:
        job = self.store.resolve_job(ref)
        verdicts = [
            {"at_s": e.at_s, "kind": e.kind, "text": e.text}
            for e in self.store.events_of(job.id)
            if e.kind in EXPLAINED_EVENTS
        ]
        return {
            "job": job_summary(job),
            "failures": [f.as_dict() for f in self.store.failures_of(job.id)],
            "decisions": verdicts,
        }

    def stacks(self, ref: str, attempt: int | None) -> list[dict[str, Any]]:
        job = self.store.resolve_job(ref)
        return [
            {
                "id": r.id,
                "job_id": job.id,
                "attempt": r.attempt,
                "at_s": r.at_s,
                "kind": r.kind,
                "culprits": (r.culprits or "").split(", ") if r.culprits else [],
                "summary": r.summary,
                "duration_ms": r.duration_ms,
                "report": json.loads(r.report_json),
                "snapshots": json.loads(r.snapshots_json),
            }
            for r in self.store.stack_dumps_of(job.id, attempt)
        ]

    def goodput(self, ref: str) -> dict[str, Any]:
        job = self.store.resolve_job(ref)
        steps = self.store.progress_of(job.id)
        g = goodput(
            job,
            self.store.attempts_of(job.id),
            self.store.restarts_of(job.id),
            steps,
            time.time(),
            self.store.transitions_of(job.id),
        )
        return {**g, "job": job_summary(job), "has_progress": bool(steps)}

    def log(
        self, ref: str, replica: str | None, attempt: int | None, tail: int | None
    ) -> dict[str, Any]:
        """A replica's log of one attempt (default: the primary's, of the last attempt)."""
        job = self.store.resolve_job(ref)
        runs = self.store.runs_of(job.id, attempt)
        if not runs:
            where = f" in attempt {attempt}" if attempt is not None else ""
            raise JobNotFound(f"job {job.id} has no replica runs{where}")
        last = max(r.attempt for r in runs)
        runs = [r for r in runs if r.attempt == last]
        name = replica or min(runs, key=lambda r: r.rank).replica
        mine = [r for r in runs if r.replica == name]
        if not mine:
            names = ", ".join(sorted({r.replica for r in runs}))
            raise JobNotFound(f"job {job.id} has no replica {name!r} (it has: {names})")
        path = Path(mine[-1].log_path or "")
        # The path comes from the store, but a log is only ever read inside the job's folder.
        if not path.resolve().is_relative_to(Path(job.log_dir).resolve()):
            raise JobNotFound(f"job {job.id}: log {path} is outside the job's folder")
        text, exists = "", path.is_file()
        if exists:
            with open(path, "rb") as fh:
                fh.seek(0, 2)
                size = fh.tell()
                fh.seek(max(0, size - MAX_LOG_BYTES))
                text = fh.read().decode("utf-8", "replace")
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:]) + "\n" if tail > 0 else ""
        return {
            "job_id": job.id,
            "replica": name,
            "attempt": last,
            "path": str(path),
            "exists": exists,
            "text": text,
        }
