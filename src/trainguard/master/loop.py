"""The job master (R-JOB-2..5, R-POL-1): one asyncio loop per job.

It waits for events (a replica started, printed, exited; a hang; a cancel), asks the
pure policy what they mean, and carries the decision out through the backend.
`step(event)` is one turn of the loop, so tests can drive it event by event.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.backends.api import (
    Backend,
    Launch,
    NoCapacity,
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaStarted,
)
from trainguard.frameworks import preset
from trainguard.frameworks.replica_plan import (
    plan_replicas,
    primary_replica,
)
from trainguard.hangs.diagnose import diagnose
from trainguard.hangs.watch import HangDetected, HangWatch
from trainguard.master.events import (
    CancelRequested,
    CapacityRetry,
    MasterEvent,
    Outcome,
    PendingRestart,
    ReplicaSlot,
    Transition,
)
from trainguard.master.inbox import Inbox
from trainguard.master.inject import FaultInjector, kill_this_master
from trainguard.master.keeper import CheckpointKeeper
from trainguard.master.launch import LaunchBuilder
from trainguard.master.ledger import Ledger
from trainguard.master.sdk_channel import SdkServer, new_token
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.catalogue import Rules
from trainguard.policy.classes import INTERNAL_ERROR_MESSAGE, Classification, ExitKind
from trainguard.policy.classify import (
    classify_exit,
    failed_before_stop,
    hang_failure,
    internal_failure,
)
from trainguard.policy.decisions import (
    STARTUP_WINDOW_S,
    Decision,
    Expire,
    FailJob,
    GiveUpReplica,
    Ignore,
    RestartJob,
    RestartReplica,
    Succeed,
    WaitForCapacity,
    decide_clean_exit,
    decide_failure,
    describe,
    root_cause,
)
from trainguard.policy.gpus import GpuPool, NotEnoughGpus
from trainguard.policy.logcontext import last_step
from trainguard.policy.verdicts import (
    arm_exit_hang,
    decide_capacity_wait,
    decide_no_capacity,
    decide_success,
    judge_hang,
)
from trainguard.records.recorder import Recorder
from trainguard.spec.injection import Injection, parse_injection
from trainguard.spec.models import ExecutionMode, JobSpec, SuccessPolicy
from trainguard.states import AttemptOutcome, ErrorCode, JobState, ReplicaState

_LAUNCH_BATCH = 256  # replica environments built between two turns of the event loop


class Master:
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
        resume_after: tuple[int, int] | None = None,
    ) -> None:
        """`resume_after` = (attempts, restarts) a resumed job already had: numbering goes on."""
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
        plans = plan_replicas(spec)
        self.replicas = {p.name: ReplicaSlot(p) for p in plans}
        self.primary = primary_replica(plans)
        self.preset = preset(spec.framework)
        self.roles = self.preset.role_policy(spec)
        self.launches = LaunchBuilder(
            job_id, self.preset, tuple(plans), log_dir, cwd, self.ft.max_num_of_job_restart
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
        self._cancel_count = 0
        self._attempt_failures: list[Failure] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._applied: list[Decision] = []  # what the current turn of the loop applied
        sync = self.ft.execution_mode is ExecutionMode.SYNC
        self.hangs = HangWatch(
            enabled=sync and self.ft.enable_job_hang_detection,
            interval_s=self.ft.job_hang_interval,
            post=self.post,
            output_activity=backend.last_output_s,
            clock=clock,
            startup_timeout_s=self.ft.startup_timeout_s,
        )
        self._exit_hang_on = sync and self.ft.enable_job_exit_hang_detection
        self._exit_hang_timer: asyncio.TimerHandle | None = None
        self.inbox = Inbox(self.hangs, recorder, say, clock)
        self.faults = FaultInjector(
            [parse_injection(t) for t in spec.fault_injection], self._inject
        )
        self.inbox.on_step = self.faults.on_step
        self.keeper = CheckpointKeeper(spec.checkpoint, log_dir, recorder, clock)
        self.inbox.on_progress = self.keeper.on_progress
        self.sdk = SdkServer(self.inbox, new_token())
        self.rules()  # load the catalogue now, not on the first failure
        gpus_of = {p.role: p.resources.gpus for p in spec.worker_pools}
        self.gpus = GpuPool([(p.name, gpus_of[p.role]) for p in plans], spec.gpu_inventory)
        self.ledger = Ledger(recorder, self.gpus, say)
        self.ledger.isolate_node = backend.isolate_after
        if resume_after is not None:
            self.attempt = resume_after[0] - 1
            self.ledger.restarts = resume_after[1]

    # -------------------------------------------------------------- the loop

    def post(self, event: MasterEvent) -> None:
        self._queue.put_nowait(event)

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Ask the loop to cancel; a second call stops the replicas without grace."""
        self._cancel_count += 1
        if self._cancel_count == 1:
            self.post(CancelRequested(reason))
        else:
            live = [n for n, r in self.replicas.items() if not r.state.is_terminal]
            task = asyncio.ensure_future(self.backend.stop(live, grace_s=0))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def begin(self) -> None:
        """Bind to the backend, open the SDK channel, start the first attempt (for tests)."""
        self.backend.bind(self.post)
        await self.sdk.start()
        await self._start_attempt()

    async def run(self) -> Outcome:
        self.backend.bind(self.post)
        await self.sdk.start()
        watch = asyncio.create_task(self.hangs.run())
        need_attempt = True
        try:
            while not self.state.is_terminal:
                try:
                    if need_attempt:
                        need_attempt = False
                        await self._start_attempt()
                    await self.step(await self._queue.get())
                except Exception as exc:  # a fault of trainguard itself, not of the job
                    need_attempt = await self._internal_error(exc)
        finally:
            watch.cancel()
            await self.shutdown()
        self.outcome.restarts = self.ledger.restarts
        return self.outcome

    async def shutdown(self) -> None:
        """Stop what is left, close the SDK channel, write what the store held back
        (the end of `run`; tests that drive `step` by hand call it too)."""
        self._cancel_exit_hang()
        self.faults.disarm()
        await self.backend.close()
        await self._settle()
        await self.sdk.close()
        await self.rec.drain()  # what a locked or full store held: written now

    async def step(self, event: MasterEvent) -> Transition:
        """One turn of the loop: handle `event`; returns what it did (tests assert on it)."""
        before, self._applied = self.state, []
        await self._handle(event)
        return Transition(before, self.state, tuple(self._applied))

    async def _handle(self, event: MasterEvent) -> None:
        match event:
            case ReplicaStarted():
                self._on_started(event)
            case ReplicaFirstOutput():
                self._on_first_output(event)
            case ReplicaExited():
                await self._on_exit(event)
            case CancelRequested():
                await self._on_cancel(event)
            case HangDetected():
                await self._on_hang(event)
            case CapacityRetry():
                if self.state is JobState.RESTARTING and event.attempt == self.attempt:
                    self.rec.queued(None)
                    await self._start_attempt()

    # -------------------------------------------------------------- transitions

    def _tear_down(self, reason: str, **job_values: object) -> None:
        """RESTARTING: the current attempt's exits from now on are consequences."""
        self._torn_down = self.attempt
        self._transition(JobState.RESTARTING, reason, **job_values)

    def _transition(self, state: JobState, reason: str, **job_values: object) -> None:
        prev, self.state = self.state, state
        self.outcome.state = state
        self.rec.transition(prev, state, self.clock(), reason, **job_values)
        self.say(f"job {self.job_id} {state.value}: {reason}")

    # -------------------------------------------------------------- attempts

    def _launch(self, rep: ReplicaSlot) -> Launch:
        channel = {
            "TRAINGUARD_MASTER_URL": self.sdk.url,
            "TRAINGUARD_TOKEN": self.sdk.token,
            "TRAINGUARD_CHECKPOINT_DIR": str(self.keeper.storage),
        }
        name = rep.plan.name
        devices = self.gpus.visible_devices(name)
        return self.launches.build(
            rep.plan, self.attempt, rep.restarts, self._rendezvous, channel, devices
        )

    async def _start_attempt(self) -> None:
        if self.attempt < 0:
            self.keeper.seed()
        try:
            self.gpus.assign()
            self._rendezvous = await self.backend.rendezvous()
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
            rep.started_s = None
        if self._pending is not None:
            self._pending.start_begin_s = self.clock()
        launches = []
        for i, rep in enumerate(self.replicas.values(), 1):
            launches.append(self._launch(rep))
            if i % _LAUNCH_BATCH == 0:
                await asyncio.sleep(0)  # a large job: SIGTERM and cancel are heard meanwhile
        await self.backend.start(launches)
        note = self.backend.preload_note
        if note and self.attempt == 0:
            self.say(note)

    def _current(self, attempt: int, replica: str, restart: int) -> ReplicaSlot | None:
        rep = self.replicas.get(replica)
        if rep is None or attempt != self.attempt or restart != rep.restarts:
            return None
        return rep

    def _on_started(self, ev: ReplicaStarted) -> None:
        rep = self._current(ev.attempt, ev.replica, ev.restart)
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
        rep.state, rep.pid, rep.run_id = ReplicaState.RUNNING, ev.pid, run_id
        rep.started_s = ev.time_s
        self._maybe_running()

    def _maybe_running(self) -> None:
        """RUNNING once every replica of the new attempt has started.

        Some may have exited already (a replica that finishes at once, one started last
        on a slow backend): counting them keeps the job from waiting forever to run.
        """
        if self.state not in (JobState.PENDING, JobState.RESTARTING) or self._is_torn_down():
            return
        states = [r.state for r in self.replicas.values()]
        running = states.count(ReplicaState.RUNNING)
        if ReplicaState.STARTING in states or not running:
            return
        pending = self._pending
        if pending is not None and not pending.started:
            pending.started = True
            self.rec.restart_phases(
                pending.record_id, start_ms=(self.clock() - pending.start_begin_s) * 1000
            )
        n = len(states)
        what = f"all {n} replicas running"
        if running < n:
            what = f"all {n} replicas started, {n - running} already exited"
        self._transition(JobState.RUNNING, f"attempt {self.attempt}: {what}")
        live = [n for n, r in self.replicas.items() if r.state is ReplicaState.RUNNING]
        self.hangs.arm(self.attempt, live)
        self.faults.arm(self.attempt)

    def _is_torn_down(self) -> bool:
        """Whether the current attempt is being stopped (its exits decide nothing)."""
        return self.state is JobState.RESTARTING and self._torn_down == self.attempt

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

    # -------------------------------------------------------------- exits

    async def _stop_and_settle(self) -> None:
        """Stop every live replica (TERM, grace, KILL), then record the exits it caused."""
        await self.backend.stop(self._live(), self.ft.stop_grace_period_s)
        await self._settle()

    async def _settle(self) -> None:
        """Record the exits a stop produced before the job moves on; they decide nothing."""
        keep: list[MasterEvent] = []
        while not self._queue.empty():
            ev = self._queue.get_nowait()
            if isinstance(ev, ReplicaExited):
                await self._on_exit(ev, decide=False)
            else:
                keep.append(ev)
        for ev in keep:
            self._queue.put_nowait(ev)

    def rules(self) -> Rules:
        """The spec's retryable keywords, those the training code set at run time, ours."""
        return Rules.default(tuple(self.ft.retryable_errors), self.inbox.keywords())

    def _trained(self, rep: ReplicaSlot, now_s: float) -> bool:
        """Past start-up: the SDK saw a step, or the replica ran for STARTUP_WINDOW_S."""
        if self.hangs.step_of(rep.plan.name) is not None:
            return True
        return rep.started_s is not None and now_s - rep.started_s >= STARTUP_WINDOW_S

    def _progress(self, rep: ReplicaSlot, tail: tuple[str, ...]) -> int | None:
        """The step a replica had reached: its SDK reports, else what its output printed."""
        step = self.hangs.step_of(rep.plan.name)
        return step if step is not None else last_step(tail)

    async def _on_exit(self, ev: ReplicaExited, decide: bool = True) -> None:
        rep = self._current(ev.attempt, ev.replica, ev.restart)
        evidence = ev.evidence
        if rep is not None and evidence.progressed is None and self._trained(rep, ev.time_s):
            evidence = replace(evidence, progressed=True)
        rules = self.rules() if rep is not None else None
        c = classify_exit(evidence, rules)
        if rep is not None:
            c = failed_before_stop(evidence, rules) or c
        state = {
            ExitKind.CLEAN: ReplicaState.SUCCEEDED,
            ExitKind.STOP_REQUESTED: ReplicaState.STOPPED,
        }.get(c.kind, ReplicaState.FAILED)
        run_id = rep.run_id if rep is not None else None
        if run_id is None and ev.pid is None:  # never started: record the attempt to start
            run_id = self._record_spawn_failure(ev)
        if run_id is not None:
            self.rec.run_ended(run_id, ev.time_s, c, state, ev.evidence.log_tail)
        if rep is None:
            return  # an exit of an earlier attempt or run, already dealt with
        self.hangs.alive(ev.replica)  # ended: it waits for nothing more to start
        rep.state = state
        rep.run_id = None
        failure: Failure | None = None
        if c.is_failure:
            tail = ev.evidence.log_tail
            failure = self._failure_of(ev.replica, ev.attempt, ev.pid, ev.time_s, c, tail)
            self._attempt_failures.append(failure)
        if c.kind is ExitKind.STOP_REQUESTED or not decide:
            return
        if self.state is JobState.CANCELLING or self.state.is_terminal or self._is_torn_down():
            return  # already restarting, cancelling or finished: this exit is a consequence
        self._maybe_running()
        if failure is None:
            decision = decide_clean_exit(
                self.spec.success_policy,
                ev.replica,
                self.primary,
                self._all_done(),
            )
            if isinstance(decision, Succeed):
                decision = self._success(decision.reason)
            if arm_exit_hang(decision, self._exit_hang_on, self._exit_hang_timer is not None):
                interval = self.ft.job_exit_hang_interval
                hang = HangDetected("exit_hang", self.attempt, interval, interval, ev.replica)
                loop = asyncio.get_running_loop()
                self._exit_hang_timer = loop.call_later(interval, self.post, hang)
        else:
            decision = self._decide(failure)
            self.ledger.decided_s = self.clock()
            if isinstance(decision, RestartJob | FailJob):
                failure, decision = await self._take_root_cause(failure, decision)
            self._record_failure(failure, decision)
            self.say(f"{failure.replica} failed: {c.message} -> {describe(decision)}")
        await self._apply(decision, failure, ev.time_s)

    async def _take_root_cause(
        self, trigger: Failure, decision: Decision
    ) -> tuple[Failure, Decision]:
        """Stop the rest (the decision stops them anyway), then decide on the root cause.

        A replica whose peer died often fails a moment later with a connection reset;
        whichever exit is seen first, the earliest non-cascade failure is the cause.
        """
        await self._stop_and_settle()
        root, _ = root_cause(self._attempt_failures)
        if root is trigger:
            return trigger, decision
        return root, self._decide(root)

    def _decide(self, failure: Failure) -> Decision:
        return decide_failure(
            self.ft,
            self.ledger.budgets,
            failure,
            len(self.replicas),
            wait_for_capacity=self.spec.queue.wait_for_capacity,
            roles=self.roles,
        )

    def _record_failure(self, root: Failure, decision: Decision) -> None:
        self.ledger.failure(root, self._attempt_failures, decision)
        self._attempt_failures = []

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
        )

    def _record_spawn_failure(self, ev: ReplicaExited) -> int:
        return self.rec.run_started(
            attempt=ev.attempt,
            replica=ev.replica,
            rank=self.replicas[ev.replica].plan.rank,
            restart=ev.restart,
            pid=None,
            log_path=self.launches.log_path(ev.attempt, ev.replica, ev.restart),
            at_s=ev.time_s,
        )

    async def _apply(self, decision: Decision, failure: Failure | None, seen_s: float) -> None:
        self._applied.append(decision)
        match decision:
            case Ignore():
                return
            case Succeed():
                await self._finish(
                    JobState.SUCCEEDED, decision.reason, decision.error_code, decision.message
                )
            case Expire():
                await self._finish(
                    JobState.EXPIRED,
                    decision.reason,
                    ErrorCode.EXPIRED,
                    error_message=decision.message,
                )
            case GiveUpReplica():
                await self._give_up(decision)
            case FailJob():
                self.outcome.failure = failure
                await self._finish(
                    JobState.FAILED,
                    decision.reason,
                    error_code=decision.error_code,
                    error_message=decision.message,
                )
            case RestartJob():
                assert failure is not None
                await self._restart_job(decision, failure, seen_s)
            case RestartReplica():
                assert failure is not None
                await self._restart_replica(decision, failure, seen_s)
            case WaitForCapacity():
                if failure is not None:  # a failure of capacity (a start has none)
                    self.ledger.restart(decision, failure, seen_s)
                message = failure.classification.message if failure else decision.message
                await self._wait_for_capacity(decision.reason, message)

    def _all_done(self) -> bool:
        """Every replica succeeded, or was given up."""
        return all(
            r.state is ReplicaState.SUCCEEDED or n in self._given_up
            for n, r in self.replicas.items()
        )

    async def _give_up(self, decision: GiveUpReplica) -> None:
        """The replica stays failed; the job goes on, and ends if it was the last one left."""
        self._given_up[decision.replica] = decision.reason
        if self.spec.success_policy is SuccessPolicy.ALL and self._all_done():
            await self._apply(self._success("every replica exited 0 or was given up"), None, 0.0)

    def _success(self, reason: str) -> Succeed:
        return decide_success(reason, self._given_up, len(self.replicas), self.spec.allow_partial)

    def _cancel_exit_hang(self) -> None:
        if self._exit_hang_timer is not None:
            self._exit_hang_timer.cancel()
            self._exit_hang_timer = None

    def _live(self) -> list[str]:
        return [n for n, r in self.replicas.items() if not r.state.is_terminal]

    async def _finish(
        self,
        state: JobState,
        reason: str,
        error_code: str | None = None,
        error_message: str | None = None,
    ) -> None:
        self.hangs.disarm()
        self._cancel_exit_hang()
        await self._stop_and_settle()
        self.rec.attempt_ended(self.attempt, self.clock(), state.value, reason)
        self.outcome.error_code, self.outcome.error_message = error_code, error_message
        self._transition(state, reason, error_code=error_code, error_message=error_message)

    async def _restart_job(self, decision: RestartJob, failure: Failure, seen_s: float) -> None:
        record_id = self.ledger.restart(decision, failure, seen_s)
        self.hangs.disarm()
        self._tear_down(describe(decision))
        await self._stop_and_settle()  # usually all stopped already
        t0, t1 = self.ledger.decided_s, self.clock()
        self.rec.attempt_ended(
            self.attempt, t1, AttemptOutcome.RESTARTED, failure.classification.message
        )
        self._pending = PendingRestart(record_id, t1)
        await self._start_attempt()
        t2 = self._pending.start_begin_s
        self.rec.restart_phases(record_id, stop_ms=(t1 - t0) * 1000, schedule_ms=(t2 - t1) * 1000)

    async def _wait_for_capacity(self, reason: str, message: str) -> None:
        """Stop everything and try again in `capacity_retry_s`, until `max_wait_s`."""
        queue, now = self.spec.queue, self.clock()
        # One wait runs over consecutive attempts that each ended waiting for capacity.
        if self._capacity_since is None or self._capacity_attempt < self.attempt - 1:
            self._capacity_since = now
        self._capacity_attempt = self.attempt
        verdict = decide_capacity_wait(queue, now - self._capacity_since, reason, message)
        if isinstance(verdict, Expire):
            await self._apply(verdict, None, now)
            return
        self.hangs.disarm()
        self._tear_down(verdict.reason, queued_reason=verdict.reason)
        await self._stop_and_settle()
        if self.attempt >= 0:
            self.rec.attempt_ended(
                self.attempt, self.clock(), AttemptOutcome.WAITING_FOR_CAPACITY, message
            )
        loop = asyncio.get_running_loop()
        loop.call_later(queue.capacity_retry_s, self.post, CapacityRetry(self.attempt))

    async def _restart_replica(
        self, decision: RestartReplica, failure: Failure, seen_s: float
    ) -> None:
        record_id = self.ledger.restart(decision, failure, seen_s)
        rep = self.replicas[decision.replica]
        rep.restarts += 1
        rep.state = ReplicaState.STARTING
        self.hangs.starting(decision.replica)
        t0 = self.clock()
        await self.backend.start([self._launch(rep)])
        self.rec.restart_phases(record_id, stop_ms=0.0, start_ms=(self.clock() - t0) * 1000)

    # -------------------------------------------------------------- cancel & internal errors

    async def _on_cancel(self, ev: CancelRequested) -> None:
        if self.state.is_terminal:
            return
        self.hangs.disarm()
        self._transition(JobState.CANCELLING, ev.reason)
        await self._stop_and_settle()
        self.rec.attempt_ended(self.attempt, self.clock(), AttemptOutcome.CANCELLED, ev.reason)
        self._transition(JobState.CANCELLED, "every replica stopped")

    # -------------------------------------------------------------- hangs

    async def _on_hang(self, ev: HangDetected) -> None:
        """Snapshot every stack, name the culprit, then decide as for any failure."""
        self._exit_hang_timer = None if ev.kind == "exit_hang" else self._exit_hang_timer
        if ev.attempt != self.attempt or self.state is not JobState.RUNNING:
            return
        left = self.hangs.startup_left()
        if ev.kind == "exit_hang" and left > 0:
            # A peer has not shown a sign of life yet: its start-up allowance runs first.
            loop = asyncio.get_running_loop()
            wait = min(left, ev.interval_s)
            self._exit_hang_timer = loop.call_later(wait, self.post, ev)
            return
        detected_s = self.clock()
        live = {n: r for n, r in self.replicas.items() if not r.state.is_terminal and r.pid}
        self.say(f"{ev.kind.replace('_', ' ')} detected after {ev.idle_s:.1f} s: taking stacks")
        files = {
            n: self.launches.log_path(self.attempt, n, r.restarts).with_suffix(".stacks.txt")
            for n, r in live.items()
            if n in self.inbox.faulthandler
        }
        targets = [(n, r.plan.rank, int(r.pid or 0)) for n, r in live.items()]
        diag = await diagnose(targets, self.hangs.beats(), files, self.clock, self.backend.snapshot)
        self.ledger.snapshot_id = self.rec.diagnosis(diag, self.attempt, detected_s, ev.kind)
        self.say(f"stacks taken in {diag.duration_ms:.0f} ms: {diag.report.summary}")
        life = self.hangs.last_activity() > detected_s
        cleared = judge_hang(ev.kind, life, diag.importing(), self._within_startup(detected_s))
        if cleared is not None:
            also = "; start-up allowance applies" if cleared.starting else ""
            self.say(f"{cleared.reason}: not a hang{also}")
            self.rec.event(detected_s, None, "hang_cleared", cleared.reason)
            for name in cleared.starting:
                self.hangs.starting(name)
            self.hangs.rearm()
            self.ledger.snapshot_id = None
            return
        who = diag.culprit or ev.replica or self.primary
        c = hang_failure(ev.kind, who, ev.interval_s, ev.idle_s, diag.report.summary, diag.where)
        tail = self.backend.log_tail(who)  # its last step: a hang at the same one recurs
        failure = self._failure_of(who, self.attempt, self.replicas[who].pid, detected_s, c, tail)
        decision = self._decide(failure)
        self.ledger.decided_s = self.clock()
        self._attempt_failures = [failure]
        self._record_failure(failure, decision)
        self.say(f"{failure.classification.message} -> {describe(decision)}")
        await self._apply(decision, failure, failure.time_s)
        self.ledger.snapshot_id = None

    def _within_startup(self, now_s: float) -> bool:
        """Whether the attempt is younger than its start-up allowance."""
        return now_s - self._attempt_started_s < self.hangs.startup_allowance()

    def _inject(self, inj: Injection) -> None:
        """Fire one injected fault (recorded as such) into the running attempt."""
        if self.state is not JobState.RUNNING or inj.attempt != self.attempt:
            return
        self.rec.event(self.clock(), inj.replica, "injection", inj.describe())
        self.say(f"injecting a fault: {inj.describe()}")
        if inj.action == "master":
            kill_this_master()
        rep = self.replicas.get(inj.replica or "")
        if rep is None or rep.pid is None or rep.state.is_terminal:
            return
        self.ledger.injected[rep.plan.name] = inj.text
        if inj.action == "exit":
            self.inbox.pending_exit[rep.plan.name] = int(inj.code or 0)
            return
        sig = signal.SIGSTOP if inj.action == "stop" else int(inj.signal or signal.SIGKILL)
        task = asyncio.ensure_future(self.backend.signal(rep.plan.name, sig))  # the seam
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _internal_error(self, exc: Exception) -> bool:
        """A fault of trainguard or its backend: retried as Vertex does (2 more attempts).

        Returns True when a new attempt should start.
        """
        detail = "".join(traceback.format_exception(exc))
        with contextlib.suppress(OSError):
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / "master-error.log", "a") as fh:
                fh.write(detail)
        self.say(f"internal error: {exc!r} (details in {self.log_dir / 'master-error.log'})")
        failure = Failure(
            replica="master",
            role="master",
            rank=-1,
            attempt=self.attempt,
            pid=os.getpid(),
            time_s=self.clock(),
            classification=internal_failure(exc),
        )
        decision = self._decide(failure)
        self.ledger.decided_s = self.clock()
        try:
            with contextlib.suppress(Exception):  # already failing; close() is the last resort
                await self.backend.stop(self._live(), self.ft.stop_grace_period_s)
            await self._settle()
            self._attempt_failures = []
            self._record_failure(failure, decision)
            if isinstance(decision, RestartJob) and not self.state.is_terminal:
                record_id = self.ledger.restart(decision, failure, failure.time_s)
                self._tear_down(describe(decision))
                self.rec.attempt_ended(
                    self.attempt, self.clock(), AttemptOutcome.INTERNAL_ERROR, repr(exc)
                )
                self._pending = PendingRestart(record_id, self.clock())
                return True
        except Exception:  # the store itself may be what failed
            pass
        self.outcome.error_code, self.outcome.error_message = (
            ErrorCode.INTERNAL,
            INTERNAL_ERROR_MESSAGE,
        )
        if not self.state.is_terminal:
            try:
                self._transition(
                    JobState.FAILED,
                    f"internal error: {exc!r}",
                    error_code=ErrorCode.INTERNAL,
                    error_message=INTERNAL_ERROR_MESSAGE,
                )
            except Exception:
                self.state = self.outcome.state = JobState.FAILED
        return False
