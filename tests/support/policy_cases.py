"""Failures of each kind, as the policy tests feed them to `decide_failure`."""

from __future__ import annotations

from typing import Any

from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.policy.actions import Decision, RestartJob, RestartReplica
from trainguard.policy.budgets import Charge, Failure
from trainguard.spec.models import FaultTolerance

TRACEBACK = (
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    "KeyError: 'x'",
)


def _evidence(kind: str, replica: str) -> ExitEvidence:
    table: dict[str, ExitEvidence] = {
        "user": ExitEvidence(replica, 1, log_tail=TRACEBACK),
        "user_plain": ExitEvidence(replica, 1),
        "spawn": ExitEvidence(replica, None, spawn_error="command not found: 'nope'"),
        "transient": ExitEvidence(replica, -11, progressed=True),  # a crash mid-training
        "abort": ExitEvidence(replica, 134, progressed=True),
        "bare_crash": ExitEvidence(replica, -11),  # nothing says it had trained: uncertain
        "preemption": ExitEvidence(replica, -9),
        "sigterm": ExitEvidence(replica, 143),
        "oom": ExitEvidence(replica, -9, oom_kills=1),
        "sigbus": ExitEvidence(replica, -7),
    }
    return table[kind]


def _failure(kind: str, replica: str = "worker-1", role: str = "worker") -> Failure:
    c = classify_exit(_evidence(kind, replica))
    assert c.is_failure
    return Failure(
        replica=replica,
        role=role,
        rank=1,
        attempt=1,
        pid=4242,
        time_s=100.0,
        classification=c,
    )


def _ft(**kw: Any) -> FaultTolerance:
    return FaultTolerance(**kw)


def _charges(d: Decision) -> tuple[Charge, ...]:
    """The charges of a restart, less the same-error count every failure carries."""
    assert isinstance(d, RestartJob | RestartReplica), d
    return tuple(c for c in d.charges if not c.budget.startswith("same_error:"))


# ---------------------------------------------------------------- outages (issue 38)

HTTP_503 = (
    "Traceback (most recent call last):",
    '  File "load.py", line 2, in <module>',
    "urllib.error.HTTPError: HTTP Error 503: Service Unavailable",
)
OUTAGE_LINES = {
    "remote service": "urllib.error.HTTPError: HTTP Error 503: Service Unavailable",
    "storage": "OSError: [Errno 116] Stale file handle",
    "network": "OSError: [Errno 110] Connection timed out",
    "rendezvous": "torch.distributed.DistStoreError: Timed out after 901 seconds",
}


def _outage(
    attempt: int,
    progress: int | None = None,
    *,
    tail: tuple[str, ...] = HTTP_503,
    progressed: bool | None = None,
    replica: str = "worker-1",
    restart: int = 0,
    uptime_s: float = 2.0,
) -> Failure:
    """A replica that failed `uptime_s` after it started (start-up, unless `progress`)."""
    c = classify_exit(ExitEvidence(replica, 1, log_tail=tail, progressed=progressed))
    return Failure(
        replica=replica,
        role="worker",
        rank=1,
        attempt=attempt,
        pid=4242 + attempt,
        time_s=100.0 * (attempt + 1),
        classification=c,
        log_tail=tail,
        restart=restart,
        progress=progress,
        uptime_s=uptime_s,
    )
