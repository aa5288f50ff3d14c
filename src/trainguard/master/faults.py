"""Faults from outside the job: injected ones (through the backend seam) and trainguard's
own internal errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import traceback

from trainguard.classify.exits import (
    internal_failure,
)
from trainguard.master.core import MasterCore
from trainguard.master.events import (
    PendingRestart,
)
from trainguard.master.inject import kill_this_master
from trainguard.policy.actions import FailJob, RestartJob, describe
from trainguard.policy.budgets import Failure
from trainguard.policy.job_rules import after_internal_error, fail_internal
from trainguard.spec.injection import Injection
from trainguard.states import AttemptOutcome, IllegalTransition, JobState
from trainguard.storage.private import append_private


class Faults(MasterCore):
    """Injected faults fire here; an internal error is recorded and retried as Vertex does."""

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
        """A fault of trainguard or its backend: retried as Vertex does (2 more attempts),
        as `job_rules.after_internal_error` says. Returns True when a new attempt should start.
        """
        detail = "".join(traceback.format_exception(exc))
        with contextlib.suppress(OSError), append_private(self.log_dir / "master-error.log") as fh:
            fh.write(detail.encode(errors="replace"))
        if self.strict_transitions and isinstance(exc, IllegalTransition):
            raise exc  # the tests: a bug of the transitions fails the run, loudly
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
        why = f"internal error: {exc!r}"
        verdict = after_internal_error(self._view(), decision, why)
        try:
            with contextlib.suppress(Exception):  # already failing; close() is the last resort
                await self.backend.stop(self._live(), self.ft.stop_grace_period_s)
            await self._settle()
            self._attempt_failures = []
            self._record_failure(failure, decision)
            if isinstance(verdict, RestartJob):
                record_id = self.ledger.restart(verdict, failure, failure.time_s)
                self._tear_down(describe(verdict))
                self.rec.attempt_ended(
                    self.attempt, self.clock(), AttemptOutcome.INTERNAL_ERROR, repr(exc)
                )
                self._pending = PendingRestart(record_id, self.clock())
                return True
        except Exception:  # the store itself may be what failed
            pass
        # Failed, or its restart could not be carried out (the store may be what failed).
        fail = verdict if isinstance(verdict, FailJob) else fail_internal(why)
        self.outcome.error_code, self.outcome.error_message = fail.error_code, fail.message
        if not self.state.is_terminal:
            try:
                self._transition(
                    JobState.FAILED,
                    fail.reason,
                    error_code=fail.error_code,
                    error_message=fail.message,
                )
            except Exception:
                self.state = self.outcome.state = JobState.FAILED
        return False
