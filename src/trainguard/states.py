"""Job and replica states (R-JOB-3), each knowing whether it is terminal, and the moves
between them that are legal (`JOB_MOVES`, `REPLICA_MOVES`, `check_move`).

A job::

    QUEUED ──admitted──> PENDING ──every replica started──> RUNNING
      │                   │  │                               │  ^
      │                   │  └──no capacity, internal error──┐ │  │ every replica started
      │                   │                                  v v  │
      │                   │                                RESTARTING ──┐ a start found
      │                   │                                     ^───────┘ no capacity again
      │                   v   (from PENDING, RUNNING or RESTARTING)
      │          SUCCEEDED | FAILED | EXPIRED | CANCELLING ──> CANCELLED | FAILED (internal)
      v
    CANCELLED | EXPIRED | FAILED (quota), by the server

    any live state ──its master was lost──> INTERRUPTED
    INTERRUPTED | CANCELLED ──resumed──> QUEUED (by the server) | PENDING (a new master)
    PENDING ──> CANCELLED: the server ends a held cancel whose master never came up

A replica (one run of it; a new attempt begins every replica afresh at STARTING)::

    STARTING ──> RUNNING ──> SUCCEEDED | FAILED | STOPPED
        └──────────────────> SUCCEEDED | FAILED | STOPPED (it ended before its start was seen)
    FAILED ──restarted alone──> STARTING
    SUCCEEDED, FAILED, STOPPED ──its group stopped for a restart──> STOPPED ──rejoin──> STARTING
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"
    # The master died while the job was live (SIGKILL, reboot). No master will move
    # it again by itself; `trainguard resume` (a later issue) may pick it up.
    INTERRUPTED = "INTERRUPTED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset(
    {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.EXPIRED,
        JobState.INTERRUPTED,
    }
)


class ReplicaState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # ended because the master asked it to

    @property
    def is_terminal(self) -> bool:
        return self in (ReplicaState.SUCCEEDED, ReplicaState.FAILED, ReplicaState.STOPPED)


class IllegalTransition(Exception):
    """A move the transitions table does not list: a bug of trainguard (raised in tests,
    recorded as an internal error in production)."""


_ENDS = (JobState.SUCCEEDED, JobState.FAILED, JobState.EXPIRED, JobState.CANCELLING)
_LOST = JobState.INTERRUPTED
_RESUMED = frozenset({JobState.QUEUED, JobState.PENDING})

JOB_MOVES: Mapping[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset(
        {JobState.PENDING, JobState.CANCELLED, JobState.EXPIRED, JobState.FAILED, _LOST}
    ),
    # CANCELLED from PENDING: the server ends a held cancel whose master never came up.
    JobState.PENDING: frozenset(
        {JobState.RUNNING, JobState.RESTARTING, *_ENDS, JobState.CANCELLED, _LOST}
    ),
    JobState.RUNNING: frozenset({JobState.RESTARTING, *_ENDS, _LOST}),
    # RESTARTING again: the next attempt's start, or a wait's retry, found no capacity.
    JobState.RESTARTING: frozenset({JobState.RUNNING, JobState.RESTARTING, *_ENDS, _LOST}),
    # FAILED: an internal error while the replicas were being stopped.
    JobState.CANCELLING: frozenset({JobState.CANCELLED, JobState.FAILED, _LOST}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.EXPIRED: frozenset(),
    JobState.CANCELLED: _RESUMED,
    JobState.INTERRUPTED: _RESUMED,
}
"""Where a job may go from each state (the graph in the module's docstring)."""

REPLICA_MOVES: Mapping[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.STARTING: frozenset(
        {ReplicaState.RUNNING, ReplicaState.SUCCEEDED, ReplicaState.FAILED, ReplicaState.STOPPED}
    ),
    ReplicaState.RUNNING: frozenset(
        {ReplicaState.SUCCEEDED, ReplicaState.FAILED, ReplicaState.STOPPED}
    ),
    # STOPPED: its group was stopped for a restart; STARTING: restarted alone.
    ReplicaState.SUCCEEDED: frozenset({ReplicaState.STOPPED}),
    ReplicaState.FAILED: frozenset({ReplicaState.STOPPED, ReplicaState.STARTING}),
    ReplicaState.STOPPED: frozenset({ReplicaState.STOPPED, ReplicaState.STARTING}),
}
"""Where one run of a replica may go from each state (the graph in the module's docstring)."""


def check_move(old: JobState | ReplicaState, new: JobState | ReplicaState) -> None:
    """Raise `IllegalTransition` unless the table lists `old` -> `new`."""
    if isinstance(old, JobState) and isinstance(new, JobState):
        legal = new in JOB_MOVES[old]
    elif isinstance(old, ReplicaState) and isinstance(new, ReplicaState):
        legal = new in REPLICA_MOVES[old]
    else:
        legal = False
    if not legal:
        kind = type(new).__name__
        raise IllegalTransition(f"illegal {kind} move: {old.value} -> {new.value}")


class ErrorCode(StrEnum):
    """A job's error code when trainguard ended it for a reason of its own; a failed
    replica's exit status (e.g. "137") is the code otherwise."""

    CAPACITY = "CAPACITY"  # too few GPUs, or no capacity on the cluster
    EXPIRED = "EXPIRED"  # waited for capacity past queue.max_wait_s
    PARTIAL = "PARTIAL"  # succeeded with some replicas given up
    INTERNAL = "INTERNAL"  # a fault of trainguard itself
    NODE_LOST = "NODE_LOST"
    HANG = "HANG"
    EXIT_HANG = "EXIT_HANG"
    SPAWN_ERROR = "SPAWN_ERROR"  # the command could not be started
    MASTER_LOST = "MASTER_LOST"  # the master died while the job was live
    CANCELLED = "CANCELLED"
    QUOTA = "QUOTA"  # a job larger than the server's whole quota


class AttemptOutcome(StrEnum):
    """How an attempt ended when the job went on (the job's final state otherwise)."""

    RESTARTED = "restarted"
    WAITING_FOR_CAPACITY = "waiting for capacity"
    CANCELLED = "cancelled"
    INTERNAL_ERROR = "internal error"
