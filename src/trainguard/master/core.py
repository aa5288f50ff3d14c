"""What every part of the job master shares: its state, its transitions, and the small
helpers that stop, settle and describe replicas. The parts (`attempts`, `exits`,
`hang_response`, `faults`) add the handlers; `loop.Master` puts them together."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from trainguard.backends.interface import (
    Backend,
    Launch,
    ReplicaExited,
)
from trainguard.classify.catalogue import Rules
from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.classify.logcontext import last_step
from trainguard.frameworks import preset
from trainguard.frameworks.replica_plan import (
    plan_replicas,
    primary_replica,
)
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.hangs.watch import HangWatch
from trainguard.master import moves
from trainguard.master.events import (
    MasterEvent,
    Outcome,
    PendingRestart,
    ReplicaSlot,
)
from trainguard.master.inbox import Inbox
from trainguard.master.inject import FaultInjector
from trainguard.master.keeper import CheckpointKeeper
from trainguard.master.launch import LaunchBuilder
from trainguard.master.ledger import Ledger
from trainguard.master.node_ledger import NodeLedger
from trainguard.master.output_progress import OutputProgress
from trainguard.master.sdk_channel import SdkServer
from trainguard.master.snapshot_keeper import SnapshotKeeper
from trainguard.policy.actions import Decision
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure
from trainguard.policy.gpus import GpuPool
from trainguard.policy.job_rules import JobView, trained, within_startup
from trainguard.records.recorder import NODE, Recorder
from trainguard.spec.injection import Injection, parse_injection
from trainguard.spec.models import ExecutionMode, JobSpec
from trainguard.states import JobState, ReplicaState
from trainguard.storage import env
from trainguard.storage.ids import new_token
from trainguard.timers import LOOP_TIMERS, Timer, Timers


class MasterCore:
    """The master's state and shared helpers; the handlers live in the mixins."""

    def __init__(
        self,
        *,
        job_id: str,
        spec: JobSpec,
        backend: Backend,
        recorder: Recorder,
        log_dir: Path,
        cwd: str,
        say: Callable[[str], None] = lambda _msg: None,
        clock: Callable[[], float] = time.time,
        timers: Timers = LOOP_TIMERS,
        resume_after: tuple[int, int] | None = None,
        strict_transitions: bool | None = None,
    ) -> None:
        """`resume_after` = (attempts, restarts) a resumed job already had: numbering goes on.
        `strict_transitions`: an illegal state move raises (None: `moves`' environment).
        `timers` runs what is due later (a test's fake moves with its clock)."""
        self.strict_transitions = moves.strict_transitions(strict_transitions)
        self.job_id = job_id
        self.spec = spec
        self.ft = spec.fault_tolerance
        self.backend = backend
        self.rec = recorder
        recorder.say = say
        self.log_dir = log_dir
        self.cwd = cwd
        self.say = say
        self.clock = clock
        self.timers = timers
        plans = plan_replicas(spec)
        self.replicas = {p.name: ReplicaSlot(p) for p in plans}
        self.primary = primary_replica(plans)
        self.preset = preset(spec.framework)
        self.roles = self.preset.role_policy(spec)
        self.launches = LaunchBuilder(
            job_id, self.preset, tuple(plans), log_dir, cwd, self.ft.max_num_of_job_restart, spec
        )
        self._given_up: dict[str, str] = {}  # replica -> why (batch shards, evaluators)
        self.state = JobState.PENDING
        self.attempt = -1
        self._capacity_since: float | None = None  # when the current wait for capacity began
        self._capacity_attempt = -1  # the attempt that last ended waiting for capacity
        self._attempt_started_s = clock()
        self._torn_down = -1  # the attempt a restart or a wait for capacity is stopping
        self.outcome = Outcome(JobState.PENDING)
        self._queue: asyncio.Queue[MasterEvent] = asyncio.Queue()
        self._rendezvous: tuple[str, int] = ("127.0.0.1", 0)
        self._pending: PendingRestart | None = None
        self._warm_notes_seen = 0  # how many of the backend's warm-start notes are recorded
        self._cancel_count = 0
        self._attempt_failures: list[Failure] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._applied: list[Decision] = []  # what the current turn of the loop applied
        # Replica groups stopped for a restart alone (torchft): group -> its restart record.
        self._groups_down: dict[int, int] = {}
        sync = self.ft.execution_mode is ExecutionMode.SYNC
        # The job's watch, and one per replica group where the framework has groups.
        self.hangs = GroupedHangWatch(
            groups=[self._ranks(members) for members in self.roles.groups],
            group_output=backend.last_output_s,
            groups_enabled=self.ft.enable_job_hang_detection,
            enabled=sync and self.ft.enable_job_hang_detection,
            interval_s=self.ft.job_hang_interval_s,
            post=self.post,
            output_activity=backend.last_output_s,
            clock=clock,
            startup_timeout_s=self.ft.startup_timeout_s,
            timers=timers,
        )
        self._exit_hang_on = sync and self.ft.enable_job_exit_hang_detection
        self._exit_hang_timer: Timer | None = None
        self.inbox = Inbox(self.hangs, recorder, say, clock)
        self.faults = FaultInjector(
            [parse_injection(t) for t in spec.fault_injection], self._inject, timers
        )
        self.inbox.on_step = self.faults.on_step
        self.keeper = CheckpointKeeper(spec.checkpoint, log_dir, recorder, clock)
        self.inbox.on_progress = self._on_sdk_progress
        self.output_progress = OutputProgress(
            spec.progress, self.primary, self._on_output_step, self._progress_note, self._later
        )
        every = spec.checkpoint.snapshot_persist_every
        self.snapshots = SnapshotKeeper(job_id, log_dir, self.keeper, every, say, clock)
        self.inbox.on_snapshot_stored = self.snapshots.on_snapshot
        self.sdk = SdkServer(self.inbox, new_token())
        self._storage_check: str | None = None  # the marker in the checkpoint storage
        self.rules()  # load the catalogue now, not on the first failure
        gpus_of = {p.role: p.resources.gpus for p in spec.worker_pools}
        self.gpus = GpuPool([(p.name, gpus_of[p.role]) for p in plans], spec.gpu_inventory)
        self.ledger = Ledger(recorder, self.gpus, say)
        self.ledger.isolate_node = backend.isolate_after
        self.node_ledger = NodeLedger(recorder, job_id, spec, backend, say, clock)
        self.node_ledger.avoid_known(NODE)
        if resume_after is not None:
            self.attempt = resume_after[0] - 1
            self.ledger.restarts = resume_after[1]

    def post(self, event: MasterEvent) -> None:
        self._queue.put_nowait(event)

    def _tear_down(self, reason: str, **job_values: object) -> None:
        """RESTARTING: the current attempt's exits from now on are consequences."""
        self._torn_down = self.attempt
        self._transition(JobState.RESTARTING, reason, **job_values)

    def _transition(self, state: JobState, reason: str, **job_values: object) -> None:
        self._check_move(self.state, state, None)
        prev, self.state = self.state, state
        self.outcome.state = state
        self.rec.transition(prev, state, self.clock(), reason, **job_values)
        self.say(f"job {self.job_id} {state.value}: {reason}")

    def _move(self, rep: ReplicaSlot, state: ReplicaState) -> None:
        """One run of a replica moves to `state` (checked against the transitions table)."""
        self._check_move(rep.state, state, rep.plan.name)
        rep.state = state

    def _check_move(
        self, old: JobState | ReplicaState, new: JobState | ReplicaState, replica: str | None
    ) -> None:
        def note(text: str) -> None:
            self.rec.event(self.clock(), replica, moves.INTERNAL_EVENT, text)
            self.say(f"internal error: {text}")

        moves.checked(old, new, self.strict_transitions, note)

    def _view(self, all_done: bool = False) -> JobView:
        """The frozen view the policy's job rules read; `all_done` only where a rule reads
        it (it is a pass over every replica)."""
        return JobView(
            state=self.state,
            attempt=self.attempt,
            torn_down=self._is_torn_down(),
            replicas=tuple((n, r.state) for n, r in self.replicas.items()),
            given_up=frozenset(self._given_up),
            all_done=all_done,
            success_policy=self.spec.success_policy,
            allow_partial=self.spec.allow_partial,
            capacity_since=self._capacity_since,
            capacity_attempt=self._capacity_attempt,
        )

    def _launch(self, rep: ReplicaSlot) -> Launch:
        channel = {
            env.ENV_MASTER_URL: self.sdk.url,
            env.ENV_TOKEN: self.sdk.token,
            env.ENV_CHECKPOINT_DIR: str(self.keeper.storage),
            env.ENV_SNAPSHOT_DIR: str(self.snapshots.root),
            env.ENV_ATTEMPT: str(self.attempt),
            env.ENV_SNAPSHOT_PERSIST_EVERY: str(self.snapshots.every),
        }
        if self._storage_check:  # a host that cannot read it back refuses to start
            channel[env.ENV_STORAGE_CHECK] = self._storage_check
        name = rep.plan.name
        devices = self.gpus.visible_devices(name)
        return self.launches.build(
            rep.plan, self.attempt, rep.restarts, self._rendezvous, channel, devices
        )

    def _current(self, attempt: int, replica: str, restart: int) -> ReplicaSlot | None:
        rep = self.replicas.get(replica)
        if rep is None or attempt != self.attempt or restart != rep.restarts:
            return None
        return rep

    def _is_torn_down(self) -> bool:
        """Whether the current attempt is being stopped (its exits decide nothing)."""
        return self.state is JobState.RESTARTING and self._torn_down == self.attempt

    async def _stop_and_settle(self) -> None:
        """Stop every live replica (TERM, grace, KILL), then record the exits it caused."""
        await self.backend.stop(self._live(), self.ft.stop_grace_period_s)
        await self._settle()

    async def _settle(self, only: Collection[str] | None = None) -> None:
        """Record the exits a stop produced before the job moves on; they decide nothing.
        `only`: the stop was of these replicas; the others' exits are left to decide."""
        keep: list[MasterEvent] = []
        while not self._queue.empty():
            ev = self._queue.get_nowait()
            if isinstance(ev, ReplicaExited) and (only is None or ev.replica in only):
                await self._on_exit(ev, decide=False)
            else:
                keep.append(ev)
        for ev in keep:
            self._queue.put_nowait(ev)

    def rules(self) -> Rules:
        """The spec's retryable keywords, those the training code set at run time, ours."""
        return Rules.default(tuple(self.ft.retryable_errors), self.inbox.keywords())

    def _trained(self, rep: ReplicaSlot, now_s: float) -> bool:
        """Past start-up (`job_rules.trained`)."""
        name = rep.plan.name
        sdk, printed = self.hangs.step_of(name), self.output_progress.step_of(name)
        return trained(sdk, printed, rep.started_s, now_s)

    def _progress(self, rep: ReplicaSlot, tail: tuple[str, ...]) -> int | None:
        """The step a replica had reached: its SDK reports, else what its output printed."""
        name = rep.plan.name
        for step in (self.hangs.step_of(name), self.output_progress.step_of(name)):
            if step is not None:
                return step
        return last_step(tail)

    def _on_sdk_progress(
        self, replica: str, step: int | None, metrics: dict[str, object], checkpoint: str | None
    ) -> None:
        if step is not None:
            self.output_progress.sdk_reported()
        self.keeper.on_progress(replica, step, metrics, checkpoint)

    def _on_output_step(self, replica: str, step: int, metrics: dict[str, object]) -> None:
        """A step read from the output: where an SDK report would go."""
        self.keeper.on_progress(replica, step, metrics, None)
        self.faults.on_step(None, step)  # the job's step: read from one replica for all

    def _progress_note(self, replica: str, text: str) -> None:
        self.rec.event(self.clock(), replica, "progress", text)
        self.say(f"{replica}: {text}")

    def _later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        return self.timers.later(delay_s, fn)

    def _decide(self, failure: Failure) -> Decision:
        return decide_failure(
            self.ft,
            self.ledger.budgets,
            failure,
            len(self.replicas),
            wait_for_capacity=self.spec.queue.wait_for_capacity,
            roles=self.roles,
            groups_up=self._groups_up(failure.replica),
        )

    def _groups_up(self, replica: str) -> int:
        """The replica groups, other than `replica`'s, whose every member is running: the
        peers a restarted group can heal from."""
        mine = self.roles.group_of(replica)
        return sum(
            1
            for g, members in enumerate(self.roles.groups)
            if g != mine
            and g not in self._groups_down
            and all(self.replicas[m].state is ReplicaState.RUNNING for m in members)
        )

    def _watch_of(self, group: int | None) -> HangWatch:
        """The hang watch of a replica group (torchft), or the job's (None)."""
        if group is not None:
            return self.hangs.group(group)
        return self.hangs

    def _ranks(self, members: Collection[str]) -> list[str]:
        """The members of a group that train (its store is a service)."""
        return [m for m in members if not self._is_service(m)]

    def _is_service(self, replica: str) -> bool:
        """A framework's own process (torchft's Lighthouse): not what success waits for."""
        return self.replicas[replica].plan.role in self.preset.services

    def _record_failure(self, root: Failure, decision: Decision) -> None:
        self.ledger.failure(root, self._attempt_failures, decision)
        self._attempt_failures = []
        self.node_ledger.after_failure(root, NODE)  # across jobs (R-EVID-4)

    @property
    def budgets(self) -> Budgets:
        return self.ledger.budgets

    def _failure_of(
        self,
        replica: str,
        attempt: int,
        pid: int | None,
        time_s: float,
        c: Classification,
        tail: tuple[str, ...] = (),
        evidence: ExitEvidence | None = None,
    ) -> Failure:
        rep = self.replicas[replica]
        plan = rep.plan
        return Failure(
            replica,
            plan.role,
            plan.rank,
            attempt,
            pid,
            time_s,
            c,
            tail,
            restart=rep.restarts,
            progress=self._progress(rep, tail),
            uptime_s=None if rep.started_s is None else time_s - rep.started_s,
            evidence=evidence,
            node=rep.node,
        )

    def _record_spawn_failure(self, ev: ReplicaExited) -> int:
        return self.rec.run_started(
            attempt=ev.attempt,
            replica=ev.replica,
            rank=self.replicas[ev.replica].plan.rank,
            restart=ev.restart,
            pid=ev.pid,
            log_path=self.launches.log_path(ev.attempt, ev.replica, ev.restart),
            at_s=ev.time_s,
        )

    def _live(self) -> list[str]:
        return [n for n, r in self.replicas.items() if not r.state.is_terminal]

    def _cancel_exit_hang(self) -> None:
        if self._exit_hang_timer is not None:
            self._exit_hang_timer.cancel()
            self._exit_hang_timer = None

    def _within_startup(self, now_s: float) -> bool:
        """Whether the attempt is younger than its start-up allowance."""
        return within_startup(self._attempt_started_s, self.hangs.startup_allowance(), now_s)

    # Handlers the loop defines (`loop.Master`); declared here for the parts that call them.

    async def _apply(self, decision: Decision, failure: Failure | None, seen_s: float) -> None:
        raise NotImplementedError

    async def _on_exit(self, ev: ReplicaExited, decide: bool = True) -> None:
        raise NotImplementedError

    def _maybe_running(self) -> None:
        raise NotImplementedError  # `attempts.Attempts`

    def _inject(self, inj: Injection) -> None:
        raise NotImplementedError
