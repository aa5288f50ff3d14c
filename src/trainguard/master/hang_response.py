"""A detected hang: take every stack, name the culprit, then decide as for a failure."""

from __future__ import annotations

from trainguard.classify.exits import (
    hang_failure,
)
from trainguard.hangs.diagnose import diagnose
from trainguard.hangs.watch import HangDetected
from trainguard.master.core import MasterCore
from trainguard.policy.actions import describe
from trainguard.policy.job_rules import exit_hang_deferral, hang_culprit
from trainguard.policy.verdicts import (
    judge_hang,
)
from trainguard.records.schema import HANG_CLEARED_EVENT
from trainguard.states import JobState


class HangResponse(MasterCore):
    async def _on_hang(self, ev: HangDetected) -> None:
        """Snapshot every stack, name the culprit, then decide as for any failure."""
        self._exit_hang_timer = None if ev.kind == "exit_hang" else self._exit_hang_timer
        if ev.attempt != self.attempt or self.state is not JobState.RUNNING:
            return
        if ev.group is not None and ev.group in self._groups_down:
            return  # the group was stopped since: its silence is no hang
        watch = self._watch_of(ev.group)
        wait = exit_hang_deferral(ev.kind, watch.startup_left(), ev.interval_s)
        if wait is not None:
            # A peer has not shown a sign of life yet: its start-up allowance runs first.
            self._exit_hang_timer = self._later(wait, lambda: self.post(ev))
            return
        detected_s = self.clock()
        live = {n: r for n, r in self.replicas.items() if not r.state.is_terminal and r.pid}
        ranks = [] if ev.group is None else self._ranks(self.roles.groups[ev.group])
        if ev.group is not None:  # that group's ranks: the others are training
            live = {n: r for n, r in live.items() if n in ranks}
            if not live:
                return  # every rank of it has ended: nothing is silent there
        what = ev.kind.replace("_", " ") + ("" if ev.group is None else f" of group {ev.group}")
        self.say(f"{what} detected after {ev.idle_s:.1f} s: taking stacks")
        files = {
            n: self.launches.log_path(self.attempt, n, r.restarts).with_suffix(".stacks.txt")
            for n, r in live.items()
            if n in self.inbox.faulthandler
        }
        targets = [(n, r.plan.rank, int(r.pid or 0)) for n, r in live.items()]
        diag = await diagnose(
            targets, self.hangs.beats(), files, self.clock, self.backend.dump_stacks
        )
        self.ledger.snapshot_id = self.rec.diagnosis(diag, self.attempt, detected_s, ev.kind)
        self.say(f"stacks taken in {diag.duration_ms:.0f} ms: {diag.report.summary}")
        life = watch.last_activity() > detected_s
        starting = self._within_startup(detected_s) or watch.startup_left() > 0
        cleared = judge_hang(ev.kind, life, diag.importing(), starting)
        if cleared is not None:
            also = "; start-up allowance applies" if cleared.starting else ""
            self.say(f"{cleared.reason}: not a hang{also}")
            self.rec.event(detected_s, None, HANG_CLEARED_EVENT, cleared.reason)
            for name in cleared.starting:
                self.hangs.starting(name)
            watch.rearm()
            self.ledger.snapshot_id = None
            return
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
        failure = self._failure_of(who, self.attempt, self.replicas[who].pid, detected_s, c, tail)
        decision = self._decide(failure)
        self.ledger.decided_s = self.clock()
        self._attempt_failures = [failure]
        self._record_failure(failure, decision)
        self.say(f"{failure.classification.message} -> {describe(decision)}")
        await self._apply(decision, failure, failure.time_s)
        self.ledger.snapshot_id = None
