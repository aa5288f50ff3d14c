"""A detected hang: take every stack, name the culprit, then decide as for a failure
(the decision goes back to the master as `Decided`)."""

from __future__ import annotations

from trainguard.backends.interface import Backend
from trainguard.classify.exits import (
    hang_failure,
)
from trainguard.hangs.diagnose import diagnose
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.hangs.watch import HangDetected
from trainguard.master.actions import Actions
from trainguard.master.events import Decided
from trainguard.master.failures import Failures
from trainguard.master.groups import watch_of
from trainguard.master.inbox import Inbox
from trainguard.master.launch import LaunchBuilder
from trainguard.master.state import MasterState
from trainguard.policy.actions import describe
from trainguard.policy.decisions import RolePolicy
from trainguard.policy.job_rules import exit_hang_deferral, hang_culprit, within_startup
from trainguard.policy.verdicts import (
    judge_hang,
)
from trainguard.records.recorder import Recorder
from trainguard.records.schema import HANG_CLEARED_EVENT
from trainguard.states import JobState


class HangResponse:
    """Hangs are diagnosed here; what they mean is the policy's (`judge_hang`, the
    failure policy)."""

    def __init__(
        self,
        job: MasterState,
        act: Actions,
        *,
        backend: Backend,
        roles: RolePolicy,
        primary: str,
        launches: LaunchBuilder,
        hangs: GroupedHangWatch,
        inbox: Inbox,
        failures: Failures,
        rec: Recorder,
    ) -> None:
        self.job, self.act, self.backend = job, act, backend
        self.roles, self.primary, self.launches = roles, primary, launches
        self.hangs, self.inbox = hangs, inbox
        self.failures, self.rec = failures, rec

    async def on_hang(self, ev: HangDetected) -> Decided | None:
        """Snapshot every stack, name the culprit, then decide as for any failure."""
        job, act = self.job, self.act
        job.exit_hang_timer = None if ev.kind == "exit_hang" else job.exit_hang_timer
        if ev.attempt != job.attempt or job.phase is not JobState.RUNNING:
            return None
        if ev.group is not None and ev.group in job.groups_down:
            return None  # the group was stopped since: its silence is no hang
        watch = watch_of(self.hangs, ev.group)
        wait = exit_hang_deferral(ev.kind, watch.startup_left(), ev.interval_s)
        if wait is not None:
            # A peer has not shown a sign of life yet: its start-up allowance runs first.
            job.exit_hang_timer = act.schedule(wait, ev)
            return None
        detected_s = act.now()
        live = {n: r for n, r in job.replicas.items() if not r.state.is_terminal and r.pid}
        ranks = [] if ev.group is None else job.ranks(self.roles.groups[ev.group])
        if ev.group is not None:  # that group's ranks: the others are training
            live = {n: r for n, r in live.items() if n in ranks}
            if not live:
                return None  # every rank of it has ended: nothing is silent there
        what = ev.kind.replace("_", " ") + ("" if ev.group is None else f" of group {ev.group}")
        act.say(f"{what} detected after {ev.idle_s:.1f} s: taking stacks")
        files = {
            n: self.launches.log_path(job.attempt, n, r.restarts).with_suffix(".stacks.txt")
            for n, r in live.items()
            if n in self.inbox.faulthandler
        }
        targets = [(n, r.plan.rank, int(r.pid or 0)) for n, r in live.items()]
        diag = await diagnose(targets, self.hangs.beats(), files, act.now, self.backend.dump_stacks)
        snapshot_id = self.rec.diagnosis(diag, job.attempt, detected_s, ev.kind)
        act.say(f"stacks taken in {diag.duration_ms:.0f} ms: {diag.report.summary}")
        life = watch.last_activity() > detected_s
        allowance = self.hangs.startup_allowance()
        starting = within_startup(job.attempt_started_s, allowance, detected_s)
        starting = starting or watch.startup_left() > 0
        cleared = judge_hang(ev.kind, life, diag.importing(), starting)
        if cleared is not None:
            also = "; start-up allowance applies" if cleared.starting else ""
            act.say(f"{cleared.reason}: not a hang{also}")
            act.note(None, HANG_CLEARED_EVENT, cleared.reason, at_s=detected_s)
            for name in cleared.starting:
                self.hangs.starting(name)
            watch.rearm()
            return None
        who = hang_culprit(diag.culprit, ev.replica, ranks, self.primary)
        c = hang_failure(
            ev.kind,
            who,
            ev.interval_s,
            ev.idle_s,
            diag.report.summary,
            diag.where,
            group=None if ev.group is None else (ev.group, ranks),
        )
        tail = self.backend.log_tail(who)  # its last step: a hang at the same one recurs
        failure = self.failures.of(who, job.attempt, job.replicas[who].pid, detected_s, c, tail)
        decision, decided_s = self.failures.judge(failure)
        job.attempt_failures = [failure]
        self.failures.record(failure, decision)
        act.say(f"{failure.classification.message} -> {describe(decision)}")
        return Decided(decision, failure, failure.time_s, decided_s, snapshot_id)
