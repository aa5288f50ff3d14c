"""A replica's exit: classify it, find the root cause, and ask the policy what it means;
the decision goes back to the master (`Decided`), which ends the job when every replica
is done."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from trainguard.backends.interface import ReplicaExited
from trainguard.classify.classes import ExitEvidence, ExitKind
from trainguard.classify.exits import (
    classify_exit,
    failed_before_stop,
    quiet_stop,
)
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.hangs.watch import HangDetected
from trainguard.master.actions import Actions
from trainguard.master.events import Decided, ReplicaSlot
from trainguard.master.failures import Failures
from trainguard.master.groups import watch_of
from trainguard.master.launch import LaunchBuilder
from trainguard.master.output_progress import OutputProgress
from trainguard.master.state import MasterState
from trainguard.policy.actions import (
    Decision,
    FailJob,
    GiveUpReplica,
    RestartJob,
    Succeed,
    describe,
)
from trainguard.policy.budgets import Failure
from trainguard.policy.decisions import RolePolicy, decide_clean_exit, root_cause
from trainguard.policy.job_rules import (
    exit_decides,
    exit_state,
    groups_done,
    success_after_give_up,
)
from trainguard.policy.verdicts import (
    arm_exit_hang,
    decide_success,
)
from trainguard.records.recorder import Recorder
from trainguard.spec.models import ExecutionMode, JobSpec
from trainguard.states import ReplicaState


class Exits:
    """What an exit means, asked of the policy; `maybe_running` is the attempts handler's
    check that the attempt now runs (an exit can complete its start)."""

    def __init__(
        self,
        job: MasterState,
        act: Actions,
        *,
        spec: JobSpec,
        roles: RolePolicy,
        primary: str,
        launches: LaunchBuilder,
        hangs: GroupedHangWatch,
        output_progress: OutputProgress,
        failures: Failures,
        rec: Recorder,
        maybe_running: Callable[[], None],
    ) -> None:
        self.job, self.act, self.spec = job, act, spec
        self.roles, self.primary, self.launches = roles, primary, launches
        self.hangs, self.output_progress = hangs, output_progress
        self.failures, self.rec = failures, rec
        self.maybe_running = maybe_running
        ft = spec.fault_tolerance
        sync = ft.execution_mode is ExecutionMode.SYNC
        self.exit_hang_on = sync and ft.enable_job_exit_hang_detection

    async def settled(self, ev: ReplicaExited) -> None:
        """An exit a stop caused: recorded; it decides nothing."""
        await self.on_exit(ev, decide=False)

    async def on_exit(self, ev: ReplicaExited, decide: bool = True) -> Decided | None:
        job = self.job
        rep = job.current(ev.attempt, ev.replica, ev.restart)
        if rep is not None:
            self.output_progress.flush()  # its last step, before what its exit costs
        evidence = ev.evidence
        c = quiet_stop(evidence)  # what the rules and the annotations would not change
        if c is None:
            evidence = evidence if rep is None else self._annotated(rep, ev)
            rules = self.failures.rules() if rep is not None else None
            c = classify_exit(evidence, rules)
            if rep is not None:
                c = failed_before_stop(evidence, rules) or c
        state = exit_state(c.kind)
        run_id = rep.run_id if rep is not None else None
        unseen = rep is not None and rep.state is ReplicaState.STARTING
        if run_id is None and (ev.pid is None or unseen):
            # Never started, or its start is still queued behind a stop's settle: the run
            # is recorded here (its start then changes nothing).
            run_id = self._record_spawn_failure(ev)
        if run_id is not None:
            self.rec.run_ended(run_id, ev.time_s, c, state, ev.evidence.log_tail)
        if rep is None:
            return None  # an exit of an earlier attempt or run, already dealt with
        self._ended(ev.replica)
        self.act.move(rep, state)
        rep.run_id = None
        failure: Failure | None = None
        if c.is_failure:
            tail = ev.evidence.log_tail
            failure = self.failures.of(ev.replica, ev.attempt, ev.pid, ev.time_s, c, tail, evidence)
            job.attempt_failures.append(failure)
        if c.kind is ExitKind.STOP_REQUESTED or not decide:
            return None
        if not exit_decides(job.view(self.spec)):
            return None  # already restarting, cancelling or finished: a consequence
        self.maybe_running()
        if failure is None:
            decision = decide_clean_exit(
                self.spec.success_policy,
                ev.replica,
                self.primary,
                job.all_done(self.roles),
            )
            if isinstance(decision, Succeed):
                decision = self._success(groups_done(decision.reason, job.groups_down))
            if arm_exit_hang(decision, self.exit_hang_on, job.exit_hang_timer is not None):
                interval = self.spec.fault_tolerance.job_exit_hang_interval_s
                hang = HangDetected("exit_hang", job.attempt, interval, interval, ev.replica)
                job.exit_hang_timer = self.act.schedule(interval, hang)
        else:
            decision, decided_s = self.failures.judge(failure)
            if isinstance(decision, RestartJob | FailJob):
                failure, decision = await self._take_root_cause(failure, decision)
            why = failure.classification.message  # the root cause's, not the trigger's
            self.act.say(f"{failure.replica} failed: {why} -> {describe(decision)}")
            self.failures.record(failure, decision)  # then what it leads to (a probation)
            return Decided(decision, failure, ev.time_s, decided_s)
        return Decided(decision, failure, ev.time_s)

    def _record_spawn_failure(self, ev: ReplicaExited) -> int:
        return self.rec.run_started(
            attempt=ev.attempt,
            replica=ev.replica,
            rank=self.job.replicas[ev.replica].plan.rank,
            restart=ev.restart,
            pid=ev.pid,
            log_path=self.launches.log_path(ev.attempt, ev.replica, ev.restart),
            at_s=ev.time_s,
        )

    def _ended(self, replica: str) -> None:
        """The watches wait for nothing more of it (nor of its group, if all of it ended)."""
        self.hangs.alive(replica)
        group = self.roles.group_of(replica)
        if group is not None and all(
            self.job.replicas[m].state.is_terminal or m == replica
            for m in self.job.ranks(self.roles.groups[group])
        ):
            watch_of(self.hangs, group).disarm()

    async def _take_root_cause(
        self, trigger: Failure, decision: Decision
    ) -> tuple[Failure, Decision]:
        """Stop the rest (the decision stops them anyway), then decide on the root cause.

        A replica whose peer died often fails a moment later with a connection reset;
        whichever exit is seen first, the earliest non-cascade failure is the cause.
        """
        await self.act.stop_all()
        self._seen_after_the_peers_finished(trigger)  # replaces it in the attempt's failures
        root, _ = root_cause(self.job.attempt_failures)
        if root is trigger:
            return trigger, decision
        return root, self.failures.decide(root)

    def _seen_after_the_peers_finished(self, failure: Failure) -> None:
        """`failure` classified again when every peer exited 0 while the rest was stopped:
        the crash came at the end of work they all finished (a crash at exit)."""
        ev = failure.evidence
        if ev is None or ev.peers_finished or not self.job.peers_finished(failure.replica):
            return
        c = classify_exit(replace(ev, peers_finished=True), self.failures.rules())
        if c.rule != failure.classification.rule:
            again = replace(failure, classification=c)
            failures = self.job.attempt_failures
            self.job.attempt_failures = [again if f is failure else f for f in failures]

    def _annotated(self, rep: ReplicaSlot, ev: ReplicaExited) -> ExitEvidence:
        """The backend's evidence, with what only the master knows about the attempt."""
        evidence = replace(ev.evidence, own_ports=self._own_ports())
        if evidence.progressed is None and self.failures.trained(rep, ev.time_s):
            evidence = replace(evidence, progressed=True)
        if self.job.peers_finished(ev.replica):
            evidence = replace(evidence, peers_finished=True)
        return evidence

    def _own_ports(self) -> tuple[int, ...]:
        """The ports trainguard chose for this attempt: the rendezvous and the tasks' own."""
        tails = (a.rpartition(":")[2] for a in self.launches.tasks.values())
        ports = {self.job.rendezvous[1], *(int(t) for t in tails if t.isdigit())}
        return tuple(sorted(p for p in ports if p > 0))

    def give_up(self, decision: GiveUpReplica) -> Decided | None:
        """The replica stays failed; the job goes on, and ends if it was the last one left."""
        job = self.job
        job.given_up[decision.replica] = decision.reason
        success = success_after_give_up(job.view(self.spec, all_done=job.all_done(self.roles)))
        return None if success is None else Decided(success)

    def _success(self, reason: str) -> Succeed:
        job = self.job
        return decide_success(reason, job.given_up, len(job.replicas), self.spec.allow_partial)
