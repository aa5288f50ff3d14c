"""A replica's exit: classify it, find the root cause, decide, and end the job when
every replica is done."""

from __future__ import annotations

from dataclasses import replace

from trainguard.backends.interface import (
    ReplicaExited,
)
from trainguard.classify.classes import ExitEvidence, ExitKind
from trainguard.classify.exits import (
    classify_exit,
    failed_before_stop,
)
from trainguard.hangs.watch import HangDetected
from trainguard.master.core import MasterCore
from trainguard.master.events import ReplicaSlot
from trainguard.policy.actions import (
    Decision,
    FailJob,
    GiveUpReplica,
    RestartJob,
    Succeed,
    describe,
)
from trainguard.policy.budgets import Failure
from trainguard.policy.decisions import decide_clean_exit, root_cause
from trainguard.policy.job_rules import success_after_give_up
from trainguard.policy.verdicts import (
    arm_exit_hang,
    decide_success,
)
from trainguard.states import JobState, ReplicaState


class Exits(MasterCore):
    """What an exit means, asked of the policy; the decision is applied by the loop."""

    async def _on_exit(self, ev: ReplicaExited, decide: bool = True) -> None:
        rep = self._current(ev.attempt, ev.replica, ev.restart)
        if rep is not None:
            self.output_progress.flush()  # its last step, before what its exit costs
        evidence = ev.evidence if rep is None else self._annotated(rep, ev)
        rules = self.rules() if rep is not None else None
        c = classify_exit(evidence, rules)
        if rep is not None:
            c = failed_before_stop(evidence, rules) or c
        state = {
            ExitKind.CLEAN: ReplicaState.SUCCEEDED,
            ExitKind.STOP_REQUESTED: ReplicaState.STOPPED,
        }.get(c.kind, ReplicaState.FAILED)
        run_id = rep.run_id if rep is not None else None
        unseen = rep is not None and rep.state is ReplicaState.STARTING
        if run_id is None and (ev.pid is None or unseen):
            # Never started, or its start is still queued behind a stop's settle: the run
            # is recorded here (its start then changes nothing).
            run_id = self._record_spawn_failure(ev)
        if run_id is not None:
            self.rec.run_ended(run_id, ev.time_s, c, state, ev.evidence.log_tail)
        if rep is None:
            return  # an exit of an earlier attempt or run, already dealt with
        self._ended(ev.replica)
        self._move(rep, state)
        rep.run_id = None
        failure: Failure | None = None
        if c.is_failure:
            tail = ev.evidence.log_tail
            failure = self._failure_of(ev.replica, ev.attempt, ev.pid, ev.time_s, c, tail, evidence)
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
                decision = self._success(self._groups_done(decision.reason))
            if arm_exit_hang(decision, self._exit_hang_on, self._exit_hang_timer is not None):
                interval = self.ft.job_exit_hang_interval_s
                hang = HangDetected("exit_hang", self.attempt, interval, interval, ev.replica)
                self._exit_hang_timer = self._later(interval, lambda: self.post(hang))
        else:
            decision = self._decide(failure)
            self.ledger.decided_s = self.clock()
            if isinstance(decision, RestartJob | FailJob):
                failure, decision = await self._take_root_cause(failure, decision)
            self._record_failure(failure, decision)
            why = failure.classification.message  # the root cause's, not the trigger's
            self.say(f"{failure.replica} failed: {why} -> {describe(decision)}")
        await self._apply(decision, failure, ev.time_s)

    def _ended(self, replica: str) -> None:
        """The watches wait for nothing more of it (nor of its group, if all of it ended)."""
        self.hangs.alive(replica)
        group = self.roles.group_of(replica)
        if group is not None and all(
            self.replicas[m].state.is_terminal or m == replica
            for m in self._ranks(self.roles.groups[group])
        ):
            self._watch_of(group).disarm()

    def _groups_done(self, reason: str) -> str:
        """Why the job succeeds, when groups that were down are not started again."""
        if not self._groups_down:
            return reason
        down = ", ".join(map(str, sorted(self._groups_down)))
        return (
            f"every group that is up exited 0 (training is done); group {down}, down for a "
            "restart, is not started again"
        )

    async def _take_root_cause(
        self, trigger: Failure, decision: Decision
    ) -> tuple[Failure, Decision]:
        """Stop the rest (the decision stops them anyway), then decide on the root cause.

        A replica whose peer died often fails a moment later with a connection reset;
        whichever exit is seen first, the earliest non-cascade failure is the cause.
        """
        await self._stop_and_settle()
        self._seen_after_the_peers_finished(trigger)  # replaces it in the attempt's failures
        root, _ = root_cause(self._attempt_failures)
        if root is trigger:
            return trigger, decision
        return root, self._decide(root)

    def _seen_after_the_peers_finished(self, failure: Failure) -> None:
        """`failure` classified again when every peer exited 0 while the rest was stopped:
        the crash came at the end of work they all finished (a crash at exit)."""
        ev = failure.evidence
        if ev is None or ev.peers_finished or not self._peers_finished(failure.replica):
            return
        c = classify_exit(replace(ev, peers_finished=True), self.rules())
        if c.rule != failure.classification.rule:
            again = replace(failure, classification=c)
            self._attempt_failures = [again if f is failure else f for f in self._attempt_failures]

    def _annotated(self, rep: ReplicaSlot, ev: ReplicaExited) -> ExitEvidence:
        """The backend's evidence, with what only the master knows about the attempt."""
        evidence = replace(ev.evidence, own_ports=self._own_ports())
        if evidence.progressed is None and self._trained(rep, ev.time_s):
            evidence = replace(evidence, progressed=True)
        if self._peers_finished(ev.replica):
            evidence = replace(evidence, peers_finished=True)
        return evidence

    def _own_ports(self) -> tuple[int, ...]:
        """The ports trainguard chose for this attempt: the rendezvous and the tasks' own."""
        tails = (a.rpartition(":")[2] for a in self.launches.tasks.values())
        ports = {self._rendezvous[1], *(int(t) for t in tails if t.isdigit())}
        return tuple(sorted(p for p in ports if p > 0))

    def _peers_finished(self, replica: str) -> bool:
        """Every other replica of the attempt exited 0 (there is at least one)."""
        peers = [r for n, r in self.replicas.items() if n != replica and not self._is_service(n)]
        return bool(peers) and all(r.state is ReplicaState.SUCCEEDED for r in peers)

    def _all_done(self) -> bool:
        """Every replica succeeded, or was given up; or, in a job of replica groups, every
        group that is up succeeded while the others were down (there is nothing left for
        them to rejoin: the training is done)."""
        up = [
            (n, r)
            for n, r in self.replicas.items()
            if not self._is_service(n) and self.roles.group_of(n) not in self._groups_down
        ]
        return bool(up) and all(
            r.state is ReplicaState.SUCCEEDED or n in self._given_up for n, r in up
        )

    async def _give_up(self, decision: GiveUpReplica) -> None:
        """The replica stays failed; the job goes on, and ends if it was the last one left."""
        self._given_up[decision.replica] = decision.reason
        success = success_after_give_up(self._view(all_done=self._all_done()))
        if success is not None:
            await self._apply(success, None, 0.0)

    def _success(self, reason: str) -> Succeed:
        return decide_success(reason, self._given_up, len(self.replicas), self.spec.allow_partial)
