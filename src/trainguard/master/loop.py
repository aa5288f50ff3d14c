"""The job master (R-JOB-2..5, R-POL-1): one asyncio loop per job.

It waits for events (a replica started, printed, exited; a hang; a cancel), asks the
pure policy what they mean, and carries the decision out through the backend.
`step(event)` is one turn of the loop, so tests can drive it event by event.

The job's state is one value (`state.MasterState`); the handlers receive it with the
actions they may take (`actions.Actions`): starting attempts (`attempts`), exits
(`exits`), replica groups and services (`groups`), hangs (`hang_response`), injected and
internal faults (`faults`). They execute and return what the policy decided (`Decided`);
this module holds the loop and `_apply`, the one place decisions are executed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trainguard.backends.interface import (
    Backend,
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.hangs.watch import HangDetected
from trainguard.master import moves
from trainguard.master.events import (
    CancelRequested,
    CapacityRetry,
    Decided,
    GroupRejoin,
    MasterEvent,
    Outcome,
    ReplicaSlot,
    Transition,
)
from trainguard.master.journal import AttemptEnded
from trainguard.master.wiring import wire
from trainguard.policy.actions import (
    Decision,
    Expire,
    FailJob,
    GiveUpReplica,
    Ignore,
    RestartGroup,
    RestartJob,
    RestartReplica,
    Succeed,
    WaitForCapacity,
    describe,
)
from trainguard.policy.budgets import Budgets
from trainguard.records.recorder import Recorder
from trainguard.records.schema import DECISION_EVENT
from trainguard.spec.models import JobSpec
from trainguard.states import AttemptOutcome, ErrorCode, JobState
from trainguard.timers import LOOP_TIMERS, Timers


class Master:
    """One job's master: the loop, cancel, and applying decisions; the handlers and the
    state they share are put together here."""

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
        strict = moves.strict_transitions(strict_transitions)
        self.job_id, self.spec, self.backend, self.rec = job_id, spec, backend, recorder
        recorder.say = say
        self.log_dir, self.cwd, self.say, self.clock = log_dir, cwd, say, clock
        p = wire(job_id, spec, backend, recorder, log_dir, cwd, say, clock, timers, strict)
        self.job, self.outcome, self.actions = p.job, p.outcome, p.actions
        self._queue, self._background = p.queue, p.background
        self._applied: list[Decision] = []  # what the current turn of the loop applied
        # What the loop and its readers (the runner, the tests) use of the parts.
        self.launches, self.hangs, self.inbox, self.faults = p.launches, p.hangs, p.inbox, p.faults
        self.sdk, self.keeper, self.snapshots, self.ledger = p.sdk, p.keeper, p.snapshots, p.ledger
        self.output_progress = p.output_progress
        self.attempts, self.groups, self.exits = p.attempts, p.groups, p.exits
        self.hang_response, self.fault_handler = p.hang_response, p.fault_handler
        if resume_after is not None:
            self.job.attempt = resume_after[0] - 1
            self.ledger.restarts = resume_after[1]

    # What tests and the runner read of the job.

    @property
    def state(self) -> JobState:
        return self.job.phase

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def replicas(self) -> dict[str, ReplicaSlot]:
        return self.job.replicas

    @property
    def budgets(self) -> Budgets:
        return self.ledger.budgets

    @property
    def strict_transitions(self) -> bool:
        """Whether an illegal state move raises (it is recorded and made otherwise)."""
        return self.actions.strict

    @strict_transitions.setter
    def strict_transitions(self, strict: bool) -> None:
        self.actions.strict = self.fault_handler.strict = strict

    def post(self, event: MasterEvent) -> None:
        if isinstance(event, ReplicaOutput) and not self.output_progress.reads(event.replica):
            return  # no turn of the loop for a line nothing here reads (95 of 96 ranks')
        self._queue.put_nowait(event)

    def cancel(self, reason: str = "cancelled by the user") -> None:
        """Ask the loop to cancel; a second call stops the replicas without grace."""
        self.job.cancel_count += 1
        if self.job.cancel_count == 1:
            self.post(CancelRequested(reason))
        else:
            self.actions.spawn(self.backend.stop(self.job.live(), grace_s=0))

    def preemption_notice(self, why: str) -> None:
        """The job is about to be stopped from outside (Slurm's warning signal): every
        replica hears it in the answer to its next SDK call (`sdk.preempted()`), and the
        records keep it. The stop itself, when it comes, cancels the job (resumable)."""
        if self.inbox.preempt is not None:
            return
        self.inbox.preempt = why
        self.actions.note(None, "preemption", why)
        self.say(f"preemption notice: {why}; the replicas are told to checkpoint")

    async def begin(self) -> None:
        """Bind to the backend, open the SDK channel, start the first attempt (for tests)."""
        self.backend.bind(self.post)
        await self.sdk.start(await self.backend.channel_host())
        await self._start_attempt()

    async def run(self) -> Outcome:
        self.backend.bind(self.post)
        await self.sdk.start(await self.backend.channel_host())
        need_attempt = True
        try:
            while not self.state.is_terminal:
                try:
                    if need_attempt:
                        need_attempt = False
                        await self._start_attempt()
                        continue  # it may have ended the job (no capacity, no GPUs)
                    await self.step(await self._queue.get())
                except Exception as exc:  # a fault of trainguard itself, not of the job
                    need_attempt = await self._internal_error(exc)
        finally:
            await self.shutdown()
        self.outcome.restarts = self.ledger.restarts
        return self.outcome

    async def shutdown(self) -> None:
        """Stop what is left, close the SDK channel, write what the store held back
        (the end of `run`; tests that drive `step` by hand call it too)."""
        self.job.cancel_exit_hang()
        self.hangs.disarm()  # its timers, with the injector's, fire no more
        self.faults.disarm()
        await self.backend.close()
        await self.snapshots.close()
        await self.actions.settle()
        await self.sdk.close()
        await self.rec.drain()  # what a locked or full store held: written now

    async def _internal_error(self, exc: Exception) -> bool:
        """A fault of trainguard itself (`faults.Faults.internal_error`): True when a new
        attempt should start."""
        return await self.fault_handler.internal_error(exc)

    async def step(self, event: MasterEvent) -> Transition:
        """One turn of the loop: handle `event`; returns what it did (tests assert on it)."""
        before, self._applied = self.state, []
        await self._handle(event)
        return Transition(before, self.state, tuple(self._applied))

    async def _handle(self, event: MasterEvent) -> None:
        match event:
            case ReplicaStarted():
                self.attempts.on_started(event)
            case ReplicaFirstOutput():
                self.attempts.on_first_output(event)
            case ReplicaOutput():
                if self.job.current(event.attempt, event.replica, event.restart) is not None:
                    self.output_progress.feed(event)
            case ReplicaExited():
                await self._apply(await self.exits.on_exit(event))
            case CancelRequested():
                await self._on_cancel(event)
            case HangDetected():
                await self._apply(await self.hang_response.on_hang(event))
            case GroupRejoin():
                await self.groups.on_group_rejoin(event)
            case CapacityRetry():
                if self.state is JobState.RESTARTING and event.attempt == self.attempt:
                    self.rec.queued(None)
                    await self._start_attempt()

    async def _start_attempt(self) -> None:
        await self._apply(await self.attempts.start_attempt())

    async def _apply(self, decided: Decided | None) -> None:
        """Execute what a handler decided; what that leads to is decided and applied in turn."""
        if decided is None:
            return
        decision, failure = decided.decision, decided.failure
        self._applied.append(decision)
        if failure is None and _explained(decision):
            # A failure's decision is in its failure record; the rest (no capacity, the
            # expiry of a wait, a partial success) are recorded here, and a wait for
            # capacity where its verdict is taken (`Attempts.wait_for_capacity`).
            self.actions.note(None, DECISION_EVENT, describe(decision))
        then: Decided | None = None
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
                then = self.exits.give_up(decision)
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
                record_id = self._restart_record(decided)
                then = await self.attempts.restart_job(
                    decision, failure, record_id, decided.decided_s
                )
            case RestartReplica():
                await self.attempts.restart_replica(decision, self._restart_record(decided))
            case RestartGroup():
                assert failure is not None
                record_id = self._restart_record(decided)
                await self.groups.restart_group(decision, failure, record_id)
            case WaitForCapacity():
                if failure is not None:  # a failure of capacity (a start has none)
                    self._restart_record(decided)
                message = failure.classification.message if failure else decision.message
                then = await self.attempts.wait_for_capacity(decision.reason, message)
        await self._apply(then)

    def _restart_record(self, decided: Decided) -> int:
        """The restart record of a failure's decision (the ledger writes it)."""
        failure = decided.failure
        assert failure is not None
        return self.ledger.restart(
            decided.decision,
            failure,
            decided.seen_s,
            decided.decided_s,
            injected=failure.replica in self.job.injected,
            snapshot_id=decided.snapshot_id,
        )

    async def _finish(
        self,
        state: JobState,
        reason: str,
        error_code: str | None = None,
        error_message: str | None = None,
    ) -> None:
        self.hangs.disarm()
        self.job.cancel_exit_hang()
        await self.actions.stop_all()
        self.actions.record(AttemptEnded(self.attempt, self.clock(), state.value, reason))
        self.outcome.error_code, self.outcome.error_message = error_code, error_message
        self.actions.transition(state, reason, error_code=error_code, error_message=error_message)

    async def _on_cancel(self, ev: CancelRequested) -> None:
        if self.state.is_terminal:
            return
        self.hangs.disarm()
        self.actions.transition(JobState.CANCELLING, ev.reason)
        await self.actions.stop_all()
        outcome = AttemptOutcome.CANCELLED
        self.actions.record(AttemptEnded(self.attempt, self.clock(), outcome, ev.reason))
        self.actions.transition(JobState.CANCELLED, "every replica stopped")


def _explained(decision: Decision) -> bool:
    """Whether a decision no failure led to needs a record of its own for `explain`."""
    if isinstance(decision, Ignore | WaitForCapacity):
        return False
    return not (isinstance(decision, Succeed) and decision.error_code is None)
