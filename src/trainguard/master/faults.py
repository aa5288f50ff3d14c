"""Faults from outside the job: injected ones (through the backend seam) and trainguard's
own internal errors."""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
from pathlib import Path

from trainguard.classify.exits import (
    internal_failure,
)
from trainguard.master.actions import Actions
from trainguard.master.events import (
    Outcome,
    PendingRestart,
)
from trainguard.master.failures import Failures
from trainguard.master.inbox import Inbox
from trainguard.master.inject import kill_this_master
from trainguard.master.journal import AttemptEnded
from trainguard.master.ledger import Ledger
from trainguard.master.state import MasterState
from trainguard.policy.actions import FailJob, RestartJob, describe
from trainguard.policy.budgets import Failure
from trainguard.policy.job_rules import after_internal_error, fail_internal
from trainguard.spec.injection import Injection
from trainguard.spec.models import JobSpec
from trainguard.states import AttemptOutcome, IllegalTransition, JobState
from trainguard.storage.private import append_private


class Faults:
    """Injected faults fire here; an internal error is recorded and retried as Vertex does."""

    def __init__(
        self,
        job: MasterState,
        act: Actions,
        *,
        spec: JobSpec,
        outcome: Outcome,
        inbox: Inbox,
        ledger: Ledger,
        failures: Failures,
        log_dir: Path,
        strict: bool,
    ) -> None:
        self.job, self.act, self.spec, self.outcome = job, act, spec, outcome
        self.inbox, self.ledger, self.failures = inbox, ledger, failures
        self.log_dir = log_dir
        self.strict = strict

    def inject(self, inj: Injection) -> bool:
        """Fire one injected fault (recorded as such) into the running attempt. False: its
        replica is between two runs, and the fault waits for the next (`FaultInjector`)."""
        job, act = self.job, self.act
        if job.phase is not JobState.RUNNING or inj.attempt != job.attempt:
            return True
        rep = job.replicas.get(inj.replica or "")
        if rep is not None and (rep.pid is None or rep.state.is_terminal):
            return False
        act.note(inj.replica, "injection", inj.describe())
        act.say(f"injecting a fault: {inj.describe()}")
        if inj.action == "master":
            kill_this_master()
        if rep is None:
            return True
        job.injected[rep.plan.name] = inj.text
        if inj.action == "exit":
            self.inbox.pending_exit[rep.plan.name] = int(inj.code or 0)
            return True
        sig = signal.SIGSTOP if inj.action == "stop" else int(inj.signal or signal.SIGKILL)
        act.signal(rep.plan.name, sig)
        return True

    async def internal_error(self, exc: Exception) -> bool:
        """A fault of trainguard or its backend: retried as Vertex does (2 more attempts),
        as `job_rules.after_internal_error` says. Returns True when a new attempt should start.
        """
        job, act = self.job, self.act
        detail = "".join(traceback.format_exception(exc))
        with contextlib.suppress(OSError), append_private(self.log_dir / "master-error.log") as fh:
            fh.write(detail.encode(errors="replace"))
        if self.strict and isinstance(exc, IllegalTransition):
            raise exc  # the tests: a bug of the transitions fails the run, loudly
        act.say(f"internal error: {exc!r} (details in {self.log_dir / 'master-error.log'})")
        failure = Failure(
            replica="master",
            role="master",
            rank=-1,
            attempt=job.attempt,
            pid=os.getpid(),
            time_s=act.now(),
            classification=internal_failure(exc),
        )
        decision, decided_s = self.failures.judge(failure)
        why = f"internal error: {exc!r}"
        verdict = after_internal_error(job.view(self.spec), decision, why)
        try:
            with contextlib.suppress(Exception):  # already failing; close() is the last resort
                await act.stop(job.live())
            await act.settle()
            job.attempt_failures = []
            self.failures.record(failure, decision)
            if isinstance(verdict, RestartJob):
                record_id = self.ledger.restart(verdict, failure, failure.time_s, decided_s)
                act.tear_down(describe(verdict))
                outcome = AttemptOutcome.INTERNAL_ERROR
                act.record(AttemptEnded(job.attempt, act.now(), outcome, repr(exc)))
                job.pending = PendingRestart(record_id, act.now())
                return True
        except Exception:  # the store itself may be what failed
            pass
        # Failed, or its restart could not be carried out (the store may be what failed).
        fail = verdict if isinstance(verdict, FailJob) else fail_internal(why)
        self.outcome.error_code, self.outcome.error_message = fail.error_code, fail.message
        if not job.phase.is_terminal:
            try:
                act.transition(
                    JobState.FAILED,
                    fail.reason,
                    error_code=fail.error_code,
                    error_message=fail.message,
                )
            except Exception:
                job.phase = self.outcome.state = JobState.FAILED
        return False
