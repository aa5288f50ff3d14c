"""The master's one explicit job state (issue 39): what a job holds between two turns of
its loop, in one value the handlers receive. Its methods only read it (the view the
policy reads, the replica an event is about, who is live); every change is made by a
handler or through the actions (`actions.Actions`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from trainguard.master.events import PendingRestart, ReplicaSlot
from trainguard.policy.budgets import Failure
from trainguard.policy.decisions import RolePolicy
from trainguard.policy.job_rules import JobView
from trainguard.spec.models import JobSpec
from trainguard.states import JobState, ReplicaState
from trainguard.timers import Timer


@dataclass
class MasterState:
    """One job's mutable state. `phase` is the job's (`states.JobState`); `attempt` counts
    from 0 (-1: none started yet)."""

    replicas: dict[str, ReplicaSlot]
    services: frozenset[str] = frozenset()  # replicas that are a framework's own processes
    phase: JobState = JobState.PENDING
    attempt: int = -1
    given_up: dict[str, str] = field(default_factory=dict)  # replica -> why (batch, evaluators)
    # Replica groups stopped for a restart alone (torchft): group -> its restart record.
    groups_down: dict[int, int] = field(default_factory=dict)
    capacity_since: float | None = None  # when the current wait for capacity began
    capacity_attempt: int = -1  # the attempt that last ended waiting for capacity
    attempt_started_s: float = 0.0
    torn_down: int = -1  # the attempt a restart or a wait for capacity is stopping
    pending: PendingRestart | None = None  # the restart whose phases are being timed
    attempt_failures: list[Failure] = field(default_factory=list)
    injected: dict[str, str] = field(default_factory=dict)  # replica -> its injection, this attempt
    rendezvous: tuple[str, int] = ("127.0.0.1", 0)
    exit_hang_timer: Timer | None = None
    warm_notes_seen: int = 0  # how many of the backend's warm-start notes are recorded
    cancel_count: int = 0
    storage_check: str | None = None  # the marker in the checkpoint storage ("": none)

    def view(self, spec: JobSpec, all_done: bool = False) -> JobView:
        """The frozen view the policy's job rules read; `all_done` only where a rule reads
        it (it is a pass over every replica)."""
        return JobView(
            state=self.phase,
            attempt=self.attempt,
            torn_down=self.is_torn_down(),
            replicas=tuple((n, r.state) for n, r in self.replicas.items()),
            given_up=frozenset(self.given_up),
            all_done=all_done,
            success_policy=spec.success_policy,
            allow_partial=spec.allow_partial,
            capacity_since=self.capacity_since,
            capacity_attempt=self.capacity_attempt,
        )

    def current(self, attempt: int, replica: str, restart: int) -> ReplicaSlot | None:
        """The replica an event is about, if that run is still its current one."""
        rep = self.replicas.get(replica)
        if rep is None or attempt != self.attempt or restart != rep.restarts:
            return None
        return rep

    def live(self) -> list[str]:
        return [n for n, r in self.replicas.items() if not r.state.is_terminal]

    def is_torn_down(self) -> bool:
        """Whether the current attempt is being stopped (its exits decide nothing)."""
        return self.phase is JobState.RESTARTING and self.torn_down == self.attempt

    def is_service(self, replica: str) -> bool:
        """A framework's own process (torchft's Lighthouse): not what success waits for."""
        return replica in self.services

    def ranks(self, members: Collection[str]) -> list[str]:
        """The members of a group that train (its store is a service)."""
        return [m for m in members if not self.is_service(m)]

    def peers_finished(self, replica: str) -> bool:
        """Every other replica of the attempt exited 0 (there is at least one). It stops at
        the first that did not: asked for each exit of a stop of every replica."""
        seen = False
        for name, rep in self.replicas.items():
            if name == replica or self.is_service(name):
                continue
            if rep.state is not ReplicaState.SUCCEEDED:
                return False
            seen = True
        return seen

    def all_done(self, roles: RolePolicy) -> bool:
        """Every replica succeeded, or was given up; or, in a job of replica groups, every
        group that is up succeeded while the others were down (there is nothing left for
        them to rejoin: the training is done)."""
        up = [
            (n, r)
            for n, r in self.replicas.items()
            if not self.is_service(n) and roles.group_of(n) not in self.groups_down
        ]
        return bool(up) and all(
            r.state is ReplicaState.SUCCEEDED or n in self.given_up for n, r in up
        )

    def groups_up(self, roles: RolePolicy, replica: str) -> int:
        """The replica groups, other than `replica`'s, whose every member is running: the
        peers a restarted group can heal from."""
        mine = roles.group_of(replica)
        return sum(
            1
            for g, members in enumerate(roles.groups)
            if g != mine
            and g not in self.groups_down
            and all(self.replicas[m].state is ReplicaState.RUNNING for m in members)
        )

    def cancel_exit_hang(self) -> None:
        """The exit-hang timer, if armed, never fires."""
        if self.exit_hang_timer is not None:
            self.exit_hang_timer.cancel()
            self.exit_hang_timer = None
