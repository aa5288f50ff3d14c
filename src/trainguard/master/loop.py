"""The job master (R-JOB-2..5, R-POL-1): one asyncio loop per job.

It waits for events (a replica started, printed, exited; a hang; a cancel), asks the
pure policy what they mean, and carries the decision out through the backend.
`step(event)` is one turn of the loop, so tests can drive it event by event. The
handlers are mixins over one shared state (`core.MasterCore`): starting attempts
(`attempts`), exits (`exits`), hangs (`hang_response`), injected and internal faults
(`faults`); this module holds the loop and `_apply`, the one place decisions are executed.
"""

from __future__ import annotations

import asyncio

from trainguard.backends.interface import (
    ReplicaExited,
    ReplicaFirstOutput,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.hangs.watch import HangDetected
from trainguard.master.attempts import Attempts
from trainguard.master.events import (
    CancelRequested,
    CapacityRetry,
    GroupRejoin,
    MasterEvent,
    Outcome,
    Transition,
)
from trainguard.master.exits import Exits
from trainguard.master.faults import Faults
from trainguard.master.groups import Groups
from trainguard.master.hang_response import HangResponse
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
from trainguard.policy.budgets import Failure
from trainguard.records.schema import DECISION_EVENT
from trainguard.states import AttemptOutcome, ErrorCode, JobState


class Master(Groups, Attempts, Exits, HangResponse, Faults):
    """One job's master: the loop, cancel, and applying decisions; handlers in the mixins."""

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

    def preemption_notice(self, why: str) -> None:
        """The job is about to be stopped from outside (Slurm's warning signal): every
        replica hears it in the answer to its next SDK call (`sdk.preempted()`), and the
        records keep it. The stop itself, when it comes, cancels the job (resumable)."""
        if self.inbox.preempt is not None:
            return
        self.inbox.preempt = why
        self.rec.event(self.clock(), None, "preemption", why)
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
        self._cancel_exit_hang()
        self.hangs.disarm()  # its timers, with the injector's, fire no more
        self.faults.disarm()
        await self.backend.close()
        await self.snapshots.close()
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
            case ReplicaOutput():
                if self._current(event.attempt, event.replica, event.restart) is not None:
                    self.output_progress.feed(event)
            case ReplicaExited():
                await self._on_exit(event)
            case CancelRequested():
                await self._on_cancel(event)
            case HangDetected():
                await self._on_hang(event)
            case GroupRejoin():
                await self._on_group_rejoin(event)
            case CapacityRetry():
                if self.state is JobState.RESTARTING and event.attempt == self.attempt:
                    self.rec.queued(None)
                    await self._start_attempt()

    async def _apply(self, decision: Decision, failure: Failure | None, seen_s: float) -> None:
        self._applied.append(decision)
        if failure is None and _explained(decision):
            # A failure's decision is in its failure record; the rest (no capacity, the
            # expiry of a wait, a partial success) are recorded here, and a wait for
            # capacity where its verdict is taken (`_wait_for_capacity`).
            self.rec.event(self.clock(), None, DECISION_EVENT, describe(decision))
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
            case RestartGroup():
                assert failure is not None
                await self._restart_group(decision, failure, seen_s)
            case WaitForCapacity():
                if failure is not None:  # a failure of capacity (a start has none)
                    self.ledger.restart(decision, failure, seen_s)
                message = failure.classification.message if failure else decision.message
                await self._wait_for_capacity(decision.reason, message)

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

    async def _on_cancel(self, ev: CancelRequested) -> None:
        if self.state.is_terminal:
            return
        self.hangs.disarm()
        self._transition(JobState.CANCELLING, ev.reason)
        await self._stop_and_settle()
        self.rec.attempt_ended(self.attempt, self.clock(), AttemptOutcome.CANCELLED, ev.reason)
        self._transition(JobState.CANCELLED, "every replica stopped")


def _explained(decision: Decision) -> bool:
    """Whether a decision no failure led to needs a record of its own for `explain`."""
    if isinstance(decision, Ignore | WaitForCapacity):
        return False
    return not (isinstance(decision, Succeed) and decision.error_code is None)
