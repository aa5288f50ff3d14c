"""`/metrics` in Prometheus' text format, computed from the store at scrape time.

Counting rows on each scrape keeps the numbers right across server restarts and for
jobs run by other processes against the same store; no in-memory counter to lose.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select

from trainguard.records.goodput import goodput
from trainguard.records.rows import JobRow
from trainguard.records.schema import jobs, restart_records, stack_snapshots
from trainguard.records.store import Store
from trainguard.states import JobState

if TYPE_CHECKING:
    from trainguard.service.scheduler import Service

LATENCY_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_PHASES = ("detect_ms", "stop_ms", "schedule_ms", "start_ms", "first_output_ms")


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: object) -> None:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.lines.append(f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}")

    def histogram(self, name: str, values: Sequence[float], **labels: object) -> None:
        for bound in LATENCY_BUCKETS_S:
            self.sample(f"{name}_bucket", sum(v <= bound for v in values), le=bound, **labels)
        self.sample(f"{name}_bucket", len(values), le="+Inf", **labels)
        self.sample(f"{name}_sum", sum(values), **labels)
        self.sample(f"{name}_count", len(values), **labels)


def _rows(store: Store, stmt: Any) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(stmt))


def render_metrics(store: Store, service: Service | None = None) -> str:
    out = _Out()
    by_state = dict(_rows(store, select(jobs.c.state, func.count()).group_by(jobs.c.state)))
    out.family("trainguard_jobs", "gauge", "Jobs in the store by state.")
    for state in JobState:
        out.sample("trainguard_jobs", by_state.get(state.value, 0), state=state.value)

    restarts = _rows(
        store, select(restart_records.c.failure_class, *(restart_records.c[p] for p in _PHASES))
    )
    out.family("trainguard_restarts_total", "counter", "Restart rounds by failure class.")
    for cls, n in sorted(Counter(r[0] or "unknown" for r in restarts).items()):
        out.sample("trainguard_restarts_total", n, failure_class=cls)

    hangs = _rows(store, select(stack_snapshots.c.kind, func.count()).group_by("kind"))
    out.family("trainguard_hang_detections_total", "counter", "Hangs detected, by kind.")
    for kind, n in sorted(hangs):
        out.sample("trainguard_hang_detections_total", n, kind=kind)

    detect = [r[1] / 1000 for r in restarts if r[1] is not None]
    out.family(
        "trainguard_detection_seconds", "histogram", "From a failure to the master knowing it."
    )
    out.histogram("trainguard_detection_seconds", detect)
    recovery = [sum(r[i] or 0 for i in range(1, 6)) / 1000 for r in restarts if r[5] is not None]
    out.family(
        "trainguard_recovery_seconds",
        "histogram",
        "From a failure to the first output of the restarted replicas.",
    )
    out.histogram("trainguard_recovery_seconds", recovery)

    out.family("trainguard_goodput_ratio", "gauge", "Productive time / wall time, per live job.")
    for job, g in _live_goodput(store):
        out.sample("trainguard_goodput_ratio", g, job_id=job.id, job_name=job.name)

    if service is not None:
        view = service.queue_view()
        out.family("trainguard_queue_length", "gauge", "Jobs waiting in the server's queue.")
        out.sample("trainguard_queue_length", len(view["queued"]))
        out.family("trainguard_quota_used", "gauge", "Quota in use by running server jobs.")
        for key, value in view["used"].items():
            out.sample("trainguard_quota_used", value, resource=key)
        out.family("trainguard_masters_started_total", "counter", "Masters this server started.")
        out.sample("trainguard_masters_started_total", service.masters_started)
    return "\n".join(out.lines) + "\n"


def _live_goodput(store: Store) -> Iterable[tuple[JobRow, float]]:
    live = [s.value for s in JobState if not s.is_terminal and s is not JobState.QUEUED]
    now = time.time()
    for job in store.jobs_in(live):
        g = goodput(
            job,
            store.attempts_of(job.id),
            store.restarts_of(job.id),
            store.progress_of(job.id),
            now,
            store.transitions_of(job.id),
        )
        yield job, float(g["goodput"])
