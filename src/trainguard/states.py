"""Job and replica states (R-JOB-3), each knowing whether it is terminal."""

from __future__ import annotations

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
