"""Starting attempts and replicas, restarting them, and waiting for capacity."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from trainguard.backends.interface import (
    Backend,
    Launch,
    NoCapacity,
    ReplicaFirstOutput,
    ReplicaStarted,
)
from trainguard.frameworks.base import Preset
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.master import node_check
from trainguard.master.actions import Actions
from trainguard.master.events import (
    CapacityRetry,
    Decided,
    PendingRestart,
    ReplicaSlot,
)
from trainguard.master.inject import FaultInjector
from trainguard.master.journal import AttemptEnded, AttemptStarted
from trainguard.master.keeper import CheckpointKeeper
from trainguard.master.launch import LaunchBuilder
from trainguard.master.node_ledger import NodeLedger
from trainguard.master.sdk_channel import SdkServer
from trainguard.master.snapshot_keeper import SnapshotKeeper
from trainguard.master.state import MasterState
from trainguard.policy.actions import Expire, RestartJob, RestartReplica, describe
from trainguard.policy.budgets import Failure
from trainguard.policy.gpus import GpuPool, NotEnoughGpus
from trainguard.policy.job_rules import capacity_wait_start, holds_running, running_reason
from trainguard.policy.verdicts import (
    decide_capacity_wait,
    decide_no_capacity,
)
from trainguard.records.recorder import Recorder
from trainguard.records.schema import DECISION_EVENT
from trainguard.spec.models import JobSpec
from trainguard.states import AttemptOutcome, JobState, ReplicaState
from trainguard.storage import env
from trainguard.storage.ids import new_token

_LAUNCH_BATCH = 256  # replica environments built between two turns of the event loop
_STARTS_ALONE = (JobState.PENDING, JobState.RUNNING)  # a replica restarted alone may start

ServicesFirst = Callable[[Sequence[Launch]], Awaitable[list[Launch]]]
"""Start the framework's services among `launches` and wait for them; returns the rest."""


class Attempts:
    """Attempts begin here: GPUs and rendezvous first, then every replica's launch.
    What the policy must judge (no capacity, a wait that expired) is returned as `Decided`."""

    def __init__(
        self,
        job: MasterState,
        act: Actions,
        *,
        spec: JobSpec,
        backend: Backend,
        preset: Preset,
        launches: LaunchBuilder,
        gpus: GpuPool,
        keeper: CheckpointKeeper,
        snapshots: SnapshotKeeper,
        sdk: SdkServer,
        hangs: GroupedHangWatch,
        faults: FaultInjector,
        node_ledger: NodeLedger,
        rec: Recorder,
        services_first: ServicesFirst,
    ) -> None:
        self.job, self.act, self.spec = job, act, spec
        self.backend, self.preset, self.launches = backend, preset, launches
        self.gpus, self.keeper, self.snapshots, self.sdk = gpus, keeper, snapshots, sdk
        self.hangs, self.faults = hangs, faults
        self.node_ledger, self.rec = node_ledger, rec
        self.services_first = services_first
        self._slots: list[ReplicaSlot] = []  # the job's replicas, in order (`_holder`)
        self._held_at = 0  # where `_holder` found one last

    async def start_attempt(self) -> Decided | None:
        job, act = self.job, self.act
        if job.attempt < 0:
            self.keeper.seed()
        if job.storage_check is None:  # once per master, a resumed one included
            token = new_token()
            job.storage_check = token if self.keeper.mark(token) else ""
        try:
            self.gpus.assign()
            job.rendezvous = await self.backend.rendezvous()
            if self.preset.task_addresses:
                names = [p.name for p in self.launches.plans]
                tasks = await self.backend.task_addresses(names, self.launches.tasks)
                self.launches.use_tasks(tasks)
        except (NotEnoughGpus, NoCapacity) as exc:
            gpus = isinstance(exc, NotEnoughGpus)
            reason = f"not enough GPUs: {exc}" if gpus else str(exc)
            return Decided(decide_no_capacity(reason, str(exc), self.spec.queue))
        job.cancel_exit_hang()
        self.hangs.disarm()
        self.faults.disarm()
        job.injected = {}
        job.attempt += 1
        job.given_up = {}
        self.keeper.new_attempt(job.attempt)
        addr, port = job.rendezvous
        job.attempt_started_s = act.now()
        act.record(AttemptStarted(job.attempt, job.attempt_started_s, addr, port))
        job.attempt_failures = []
        for rep in job.replicas.values():
            rep.state, rep.pid, rep.restarts, rep.run_id = ReplicaState.STARTING, None, 0, None
            rep.started_s, rep.node = None, None
        if job.pending is not None:
            job.pending.start_begin_s = act.now()
        launches, channel = [], self._channel()
        for i, rep in enumerate(job.replicas.values(), 1):
            launches.append(self.launch(rep, channel))
            if i % _LAUNCH_BATCH == 0:
                await asyncio.sleep(0)  # a large job: SIGTERM and cancel are heard meanwhile
        job.groups_down.clear()
        launches = await self.services_first(launches)
        await act.start(launches)
        return None

    def launch(self, rep: ReplicaSlot, channel: dict[str, str] | None = None) -> Launch:
        """The launch of `rep`'s next run in the current attempt; `channel`: `_channel()`,
        made once for all the replicas an attempt starts."""
        channel = self._channel() if channel is None else channel
        devices = self.gpus.visible_devices(rep.plan.name)
        return self.launches.build(
            rep.plan, self.job.attempt, rep.restarts, self.job.rendezvous, channel, devices
        )

    def _channel(self) -> dict[str, str]:
        """The SDK channel's variables of the current attempt (the same for every replica)."""
        channel = {
            env.ENV_MASTER_URL: self.sdk.url,
            env.ENV_TOKEN: self.sdk.token,
            env.ENV_CHECKPOINT_DIR: str(self.keeper.storage),
            env.ENV_SNAPSHOT_DIR: str(self.snapshots.root),
            env.ENV_ATTEMPT: str(self.job.attempt),
            env.ENV_SNAPSHOT_PERSIST_EVERY: str(self.snapshots.every),
        }
        if self.job.storage_check:  # a host that cannot read it back refuses to start
            channel[env.ENV_STORAGE_CHECK] = self.job.storage_check
        return channel

    def on_started(self, ev: ReplicaStarted) -> None:
        rep = self.job.current(ev.attempt, ev.replica, ev.restart)
        if rep is not None and rep.state.is_terminal:
            return  # its exit was taken first (while a stop settled) and recorded the run
        log_path = self.launches.log_path(ev.attempt, ev.replica, ev.restart)
        run_id = self.rec.run_started(
            attempt=ev.attempt,
            replica=ev.replica,
            rank=self.job.replicas[ev.replica].plan.rank,
            restart=ev.restart,
            pid=ev.pid,
            log_path=log_path,
            at_s=ev.time_s,
            node=ev.node,
        )
        if rep is None:
            return
        self.act.move(rep, ReplicaState.RUNNING)
        rep.pid, rep.run_id = ev.pid, run_id
        rep.started_s, rep.node = ev.time_s, ev.node
        self.maybe_running()
        self.faults.on_started(ev.replica)

    def maybe_running(self) -> None:
        """RUNNING once every replica of the new attempt has started (`running_reason`)."""
        job = self.job
        if self._holder() is not None:
            return  # not yet, whatever the rest: no view of every replica at every start
        reason = running_reason(job.view(self.spec))
        if reason is None:
            return
        pending = job.pending
        if pending is not None and not pending.started:
            pending.started = True
            start_ms = (self.act.now() - pending.start_begin_s) * 1000
            self.rec.restart_phases(pending.record_id, start_ms=start_ms)
        self.act.transition(JobState.RUNNING, reason)
        live = [n for n, r in job.replicas.items() if r.state is ReplicaState.RUNNING]
        self.hangs.arm(job.attempt, live)
        self.faults.arm(job.attempt)

    def _holder(self) -> ReplicaSlot | None:
        """A replica that keeps the attempt from RUNNING (`holds_running`), if any. The one
        found last is asked first, then the next ones in order (replicas mostly start in
        the order they are listed): 1,024 starts cost about 1,024 looks, not a million."""
        slots = self._slots
        if len(slots) != len(self.job.replicas):
            slots = self._slots = list(self.job.replicas.values())
        n = len(slots)
        for k in range(n):
            i = (self._held_at + k) % n
            if holds_running(slots[i].state):
                self._held_at = i
                return slots[i]
        return None

    def on_first_output(self, ev: ReplicaFirstOutput) -> None:
        job = self.job
        rep = job.replicas.get(ev.replica)
        if ev.attempt == job.attempt and rep is not None and ev.restart == rep.restarts:
            self.hangs.alive(ev.replica)
        pending = job.pending
        if pending is None or pending.first_output or ev.attempt != job.attempt:
            return
        pending.first_output = True
        self.rec.restart_phases(
            pending.record_id, first_output_ms=(ev.time_s - pending.start_begin_s) * 1000
        )

    async def restart_job(
        self, decision: RestartJob, failure: Failure, record_id: int, decided_s: float
    ) -> Decided | None:
        """Stop the attempt, check the nodes if the failure calls for it, start the next
        one (after the decision's backoff, if any). `record_id`: the restart's record."""
        job, act = self.job, self.act
        self.hangs.disarm()
        act.tear_down(describe(decision))
        await act.stop_all()  # usually all stopped already
        await node_check.before_restart(  # a machine's fault?
            act, self.backend, self.rec, self.node_ledger, failure, record_id
        )
        t0, t1 = decided_s, act.now()
        message = failure.classification.message
        act.record(AttemptEnded(job.attempt, t1, AttemptOutcome.RESTARTED, message))
        job.pending = PendingRestart(record_id, t1)
        if decision.delay_s > 0:  # an outage's backoff: the loop hears a cancel meanwhile
            self._wait_then_start(decision.delay_s, record_id, (t1 - t0) * 1000)
            return None
        decided = await self.start_attempt()
        t2 = job.pending.start_begin_s
        self.rec.restart_phases(record_id, stop_ms=(t1 - t0) * 1000, schedule_ms=(t2 - t1) * 1000)
        return decided

    def _wait_then_start(self, delay_s: float, record_id: int, stop_ms: float) -> None:
        """The next attempt starts in `delay_s` (a `CapacityRetry`, which starts one if the
        job is still restarting then); the wait is the restart's schedule phase."""
        self.rec.restart_phases(record_id, stop_ms=stop_ms, schedule_ms=delay_s * 1000)
        self.act.say(f"job {self.rec.job_id}: the next attempt starts in {delay_s:g} s (backoff)")
        self.act.schedule(delay_s, CapacityRetry(self.job.attempt))

    async def wait_for_capacity(self, reason: str, message: str) -> Decided | None:
        """Stop everything and try again in `capacity_retry_s`, until `max_wait_s`."""
        job, act = self.job, self.act
        queue, now = self.spec.queue, act.now()
        # One wait runs over consecutive attempts that each ended waiting for capacity.
        job.capacity_since = capacity_wait_start(job.view(self.spec), now)
        job.capacity_attempt = job.attempt
        verdict = decide_capacity_wait(queue, now - job.capacity_since, reason, message)
        if isinstance(verdict, Expire):
            return Decided(verdict, None, now)
        act.note(None, DECISION_EVENT, describe(verdict), at_s=now)
        self.hangs.disarm()
        act.tear_down(verdict.reason, queued_reason=verdict.reason)
        await act.stop_all()
        if job.attempt >= 0:
            outcome = AttemptOutcome.WAITING_FOR_CAPACITY
            act.record(AttemptEnded(job.attempt, act.now(), outcome, message))
        act.schedule(queue.capacity_retry_s, CapacityRetry(job.attempt))
        return None

    async def restart_replica(self, decision: RestartReplica, record_id: int) -> None:
        rep = self.job.replicas[decision.replica]
        rep.restarts += 1
        self.act.move(rep, ReplicaState.STARTING)
        self.hangs.starting(decision.replica)
        if decision.delay_s > 0:  # an outage's backoff; the loop and the others go on
            self._start_alone_later(rep, decision.delay_s, record_id)
            return
        await self._start_alone(rep, record_id)

    def _start_alone_later(self, rep: ReplicaSlot, wait_s: float, record_id: int) -> None:
        """Start a replica restarted alone once its backoff is over, if it still may."""
        attempt, restart = self.job.attempt, rep.restarts
        self.rec.restart_phases(record_id, schedule_ms=wait_s * 1000)

        def due() -> None:
            self.act.spawn(self._start_alone_if(rep, attempt, restart, record_id))

        self.act.later(wait_s, due)

    async def _start_alone_if(
        self, rep: ReplicaSlot, attempt: int, restart: int, record_id: int
    ) -> None:
        """The backoff is over: start the replica, unless the job moved on meanwhile."""
        if self.job.current(attempt, rep.plan.name, restart) is not rep:
            return  # a new attempt began meanwhile
        if rep.state is not ReplicaState.STARTING or self.job.phase not in _STARTS_ALONE:
            return  # the job ended or is being cancelled or restarted
        await self._start_alone(rep, record_id)

    async def _start_alone(self, rep: ReplicaSlot, record_id: int) -> None:
        t0 = self.act.now()
        await self.act.start([self.launch(rep)])
        self.rec.restart_phases(record_id, stop_ms=0.0, start_ms=(self.act.now() - t0) * 1000)
