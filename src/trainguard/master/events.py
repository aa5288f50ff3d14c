"""What the master's loop handles and keeps: its events, each replica's slot, the restart in
progress, a decision a handler reached, and the job's outcome."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.backends.interface import (
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.frameworks.replica_plan import ReplicaPlan
from trainguard.hangs.watch import HangDetected
from trainguard.policy.actions import Decision
from trainguard.policy.budgets import Failure
from trainguard.states import JobState, ReplicaState


@dataclass(frozen=True)
class CancelRequested:
    reason: str = "cancelled by the user"


@dataclass(frozen=True)
class CapacityRetry:
    """The wait for capacity is over: try a new attempt (if still waiting)."""

    attempt: int


@dataclass(frozen=True)
class GroupRejoin:
    """A stopped replica group may start again (the Lighthouse has dropped it by now)."""

    attempt: int
    group: int
    record_id: int  # the restart record of the stop it ends (a later stop supersedes it)


MasterEvent = (
    ReplicaStarted
    | ReplicaFirstOutput
    | ReplicaOutput
    | ReplicaExited
    | CancelRequested
    | HangDetected
    | CapacityRetry
    | GroupRejoin
)


@dataclass
class ReplicaSlot:
    plan: ReplicaPlan
    state: ReplicaState = ReplicaState.STARTING
    pid: int | None = None
    restarts: int = 0  # restarts alone within the current attempt (async mode)
    run_id: int | None = None
    started_s: float | None = None  # when its current run started
    node: str | None = None  # where its current run runs (the backend's label)


@dataclass
class PendingRestart:
    """Phase timings of the restart in progress, filled in as the new attempt comes up."""

    record_id: int
    start_begin_s: float
    started: bool = False
    first_output: bool = False


@dataclass
class Outcome:
    state: JobState
    error_code: str | None = None
    error_message: str | None = None
    failure: Failure | None = None
    attempts: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class Transition:
    """What one turn of the loop did: the job's state before and after, and the
    decisions it applied (in order; none for an event that needed no decision)."""

    before: JobState
    after: JobState
    decisions: tuple[Decision, ...] = ()

    @property
    def decision(self) -> Decision | None:
        """The last decision applied, if any."""
        return self.decisions[-1] if self.decisions else None


@dataclass(frozen=True)
class Decided:
    """A decision a handler reached, for the master to apply (`loop.Master._apply`, the one
    place decisions are executed): with the failure that led to it, seen at `seen_s` and
    decided at `decided_s`, and the stacks taken for it (a hang's)."""

    decision: Decision
    failure: Failure | None = None
    seen_s: float = 0.0
    decided_s: float = 0.0
    snapshot_id: int | None = None
