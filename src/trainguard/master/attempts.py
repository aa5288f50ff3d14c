"""Starting attempts and replicas, restarting them, and waiting for capacity."""

from __future__ import annotations

import asyncio

from trainguard.backends.interface import (
    Launch,
    NoCapacity,
    ReplicaFirstOutput,
    ReplicaStarted,
)
from trainguard.master import node_check
from trainguard.master.core import MasterCore
from trainguard.master.events import (
    CapacityRetry,
    PendingRestart,
    ReplicaSlot,
)
from trainguard.policy.actions import Expire, RestartJob, RestartReplica, describe
from trainguard.policy.budgets import Failure
from trainguard.policy.gpus import NotEnoughGpus
from trainguard.policy.job_rules import capacity_wait_start, running_reason
from trainguard.policy.verdicts import (
    decide_capacity_wait,
    decide_no_capacity,
)
from trainguard.records.schema import DECISION_EVENT, WARM_START_EVENT
from trainguard.states import AttemptOutcome, JobState, ReplicaState
from trainguard.storage.ids import new_token

_LAUNCH_BATCH = 256  # replica environments built between two turns of the event loop
_STARTS_ALONE = (JobState.PENDING, JobState.RUNNING)  # a replica restarted alone may start


class Attempts(MasterCore):
    """Attempts begin here: GPUs and rendezvous first, then every replica's launch."""

    async def _start_attempt(self) -> None:
        if self.attempt < 0:
            self.keeper.seed()
        if self._storage_check is None:  # once per master, a resumed one included
            token = new_token()
            self._storage_check = token if self.keeper.mark(token) else ""
        try:
            self.gpus.assign()
            self._rendezvous = await self.backend.rendezvous()
            if self.preset.task_addresses:
                names = [p.name for p in self.launches.plans]
                tasks = await self.backend.task_addresses(names, self.launches.tasks)
                self.launches.use_tasks(tasks)
        except (NotEnoughGpus, NoCapacity) as exc:
            gpus = isinstance(exc, NotEnoughGpus)
            reason = f"not enough GPUs: {exc}" if gpus else str(exc)
            await self._apply(decide_no_capacity(reason, str(exc), self.spec.queue), None, 0.0)
            return
        self._cancel_exit_hang()
        self.hangs.disarm()
        self.faults.disarm()
        self.ledger.injected = {}
        self.attempt += 1
        self._given_up = {}
        self.keeper.new_attempt(self.attempt)
        addr, port = self._rendezvous
        self._attempt_started_s = self.clock()
        self.rec.attempt_started(self.attempt, self._attempt_started_s, addr, port)
        self.outcome.attempts = self.attempt + 1
        self._attempt_failures = []
        for rep in self.replicas.values():
            rep.state, rep.pid, rep.restarts, rep.run_id = ReplicaState.STARTING, None, 0, None
            rep.started_s, rep.node = None, None
        if self._pending is not None:
            self._pending.start_begin_s = self.clock()
        launches = []
        for i, rep in enumerate(self.replicas.values(), 1):
            launches.append(self._launch(rep))
            if i % _LAUNCH_BATCH == 0:
                await asyncio.sleep(0)  # a large job: SIGTERM and cancel are heard meanwhile
        self._groups_down.clear()
        launches = await self._start_services_first(launches)
        await self.backend.start(launches)
        self._record_warm_start()

    async def _start_services_first(self, launches: list[Launch]) -> list[Launch]:
        raise NotImplementedError  # `groups.Groups`

    def _record_warm_start(self) -> None:
        """Say and record what the backend's warm start did since the last start."""
        notes = self.backend.warm_start_notes
        for note in notes[self._warm_notes_seen :]:
            self.say(note)
            self.rec.event(self.clock(), None, WARM_START_EVENT, note)
        self._warm_notes_seen = len(notes)

    def _on_started(self, ev: ReplicaStarted) -> None:
        rep = self._current(ev.attempt, ev.replica, ev.restart)
        if rep is not None and rep.state.is_terminal:
            return  # its exit was taken first (while a stop settled) and recorded the run
        log_path = self.launches.log_path(ev.attempt, ev.replica, ev.restart)
        run_id = self.rec.run_started(
            attempt=ev.attempt,
            replica=ev.replica,
            rank=self.replicas[ev.replica].plan.rank,
            restart=ev.restart,
            pid=ev.pid,
            log_path=log_path,
            at_s=ev.time_s,
            node=ev.node,
        )
        if rep is None:
            return
        self._move(rep, ReplicaState.RUNNING)
        rep.pid, rep.run_id = ev.pid, run_id
        rep.started_s, rep.node = ev.time_s, ev.node
        self._maybe_running()

    def _maybe_running(self) -> None:
        """RUNNING once every replica of the new attempt has started (`running_reason`)."""
        reason = running_reason(self._view())
        if reason is None:
            return
        pending = self._pending
        if pending is not None and not pending.started:
            pending.started = True
            self.rec.restart_phases(
                pending.record_id, start_ms=(self.clock() - pending.start_begin_s) * 1000
            )
        self._transition(JobState.RUNNING, reason)
        live = [n for n, r in self.replicas.items() if r.state is ReplicaState.RUNNING]
        self.hangs.arm(self.attempt, live)
        self.faults.arm(self.attempt)

    def _on_first_output(self, ev: ReplicaFirstOutput) -> None:
        rep = self.replicas.get(ev.replica)
        if ev.attempt == self.attempt and rep is not None and ev.restart == rep.restarts:
            self.hangs.alive(ev.replica)
        pending = self._pending
        if pending is None or pending.first_output or ev.attempt != self.attempt:
            return
        pending.first_output = True
        self.rec.restart_phases(
            pending.record_id, first_output_ms=(ev.time_s - pending.start_begin_s) * 1000
        )

    async def _restart_job(self, decision: RestartJob, failure: Failure, seen_s: float) -> None:
        record_id = self.ledger.restart(decision, failure, seen_s)
        self.hangs.disarm()
        self._tear_down(describe(decision))
        await self._stop_and_settle()  # usually all stopped already
        await node_check.before_restart(self, failure, record_id)  # a machine's fault?
        t0, t1 = self.ledger.decided_s, self.clock()
        self.rec.attempt_ended(
            self.attempt, t1, AttemptOutcome.RESTARTED, failure.classification.message
        )
        self._pending = PendingRestart(record_id, t1)
        if decision.delay_s > 0:  # an outage's backoff: the loop hears a cancel meanwhile
            self._wait_then_start(decision.delay_s, record_id, (t1 - t0) * 1000)
            return
        await self._start_attempt()
        t2 = self._pending.start_begin_s
        self.rec.restart_phases(record_id, stop_ms=(t1 - t0) * 1000, schedule_ms=(t2 - t1) * 1000)

    def _wait_then_start(self, delay_s: float, record_id: int, stop_ms: float) -> None:
        """The next attempt starts in `delay_s` (a `CapacityRetry`, which starts one if the
        job is still restarting then); the wait is the restart's schedule phase."""
        self.rec.restart_phases(record_id, stop_ms=stop_ms, schedule_ms=delay_s * 1000)
        self.say(f"job {self.job_id}: the next attempt starts in {delay_s:g} s (backoff)")
        retry = CapacityRetry(self.attempt)
        self._later(delay_s, lambda: self.post(retry))

    async def _wait_for_capacity(self, reason: str, message: str) -> None:
        """Stop everything and try again in `capacity_retry_s`, until `max_wait_s`."""
        queue, now = self.spec.queue, self.clock()
        # One wait runs over consecutive attempts that each ended waiting for capacity.
        self._capacity_since = capacity_wait_start(self._view(), now)
        self._capacity_attempt = self.attempt
        verdict = decide_capacity_wait(queue, now - self._capacity_since, reason, message)
        if isinstance(verdict, Expire):
            await self._apply(verdict, None, now)
            return
        self.rec.event(now, None, DECISION_EVENT, describe(verdict))
        self.hangs.disarm()
        self._tear_down(verdict.reason, queued_reason=verdict.reason)
        await self._stop_and_settle()
        if self.attempt >= 0:
            self.rec.attempt_ended(
                self.attempt, self.clock(), AttemptOutcome.WAITING_FOR_CAPACITY, message
            )
        retry = CapacityRetry(self.attempt)
        self._later(queue.capacity_retry_s, lambda: self.post(retry))

    async def _restart_replica(
        self, decision: RestartReplica, failure: Failure, seen_s: float
    ) -> None:
        record_id = self.ledger.restart(decision, failure, seen_s)
        rep = self.replicas[decision.replica]
        rep.restarts += 1
        self._move(rep, ReplicaState.STARTING)
        self.hangs.starting(decision.replica)
        if decision.delay_s > 0:  # an outage's backoff; the loop and the others go on
            self._start_alone_later(rep, decision.delay_s, record_id)
            return
        await self._start_alone(rep, record_id)

    def _start_alone_later(self, rep: ReplicaSlot, wait_s: float, record_id: int) -> None:
        """Start a replica restarted alone once its backoff is over, if it still may."""
        attempt, restart = self.attempt, rep.restarts
        self.rec.restart_phases(record_id, schedule_ms=wait_s * 1000)

        def due() -> None:
            task = asyncio.ensure_future(self._start_alone_if(rep, attempt, restart, record_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        self._later(wait_s, due)

    async def _start_alone_if(
        self, rep: ReplicaSlot, attempt: int, restart: int, record_id: int
    ) -> None:
        """The backoff is over: start the replica, unless the job moved on meanwhile."""
        if self._current(attempt, rep.plan.name, restart) is not rep:
            return  # a new attempt began meanwhile
        if rep.state is not ReplicaState.STARTING or self.state not in _STARTS_ALONE:
            return  # the job ended or is being cancelled or restarted
        await self._start_alone(rep, record_id)

    async def _start_alone(self, rep: ReplicaSlot, record_id: int) -> None:
        t0 = self.clock()
        await self.backend.start([self._launch(rep)])
        self._record_warm_start()
        self.rec.restart_phases(record_id, stop_ms=0.0, start_ms=(self.clock() - t0) * 1000)
