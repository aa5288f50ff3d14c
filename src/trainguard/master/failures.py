"""A failure as the policy sees it: built from what the master knows of the replica (its
progress, uptime, node), decided on by the failure policy, and written to the ledgers.
Shared by the handlers of exits, hangs and internal errors."""

from __future__ import annotations

from collections.abc import Callable

from trainguard.classify.catalogue import Rules
from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.classify.logcontext import last_step
from trainguard.hangs.group_watch import GroupedHangWatch
from trainguard.master.events import ReplicaSlot
from trainguard.master.inbox import Inbox
from trainguard.master.ledger import Ledger
from trainguard.master.node_ledger import NodeLedger
from trainguard.master.output_progress import OutputProgress
from trainguard.master.state import MasterState
from trainguard.policy.actions import Decision
from trainguard.policy.budgets import Failure
from trainguard.policy.decisions import RolePolicy, decide_failure
from trainguard.policy.job_rules import trained
from trainguard.records.recorder import NODE
from trainguard.spec.models import JobSpec


class Failures:
    """The handlers' one way to build, decide on and record a failure."""

    def __init__(
        self,
        job: MasterState,
        spec: JobSpec,
        roles: RolePolicy,
        ledger: Ledger,
        node_ledger: NodeLedger,
        hangs: GroupedHangWatch,
        output_progress: OutputProgress,
        inbox: Inbox,
        clock: Callable[[], float],
    ) -> None:
        self.job = job
        self.spec = spec
        self.roles = roles
        self.ledger = ledger
        self.node_ledger = node_ledger
        self.hangs = hangs
        self.output_progress = output_progress
        self.inbox = inbox
        self.clock = clock

    def rules(self) -> Rules:
        """The spec's retryable keywords, those the training code set at run time, ours."""
        return Rules.default(
            tuple(self.spec.fault_tolerance.retryable_errors), self.inbox.keywords()
        )

    def trained(self, rep: ReplicaSlot, now_s: float) -> bool:
        """Past start-up (`job_rules.trained`)."""
        name = rep.plan.name
        sdk, printed = self.hangs.step_of(name), self.output_progress.step_of(name)
        return trained(sdk, printed, rep.started_s, now_s)

    def progress(self, rep: ReplicaSlot, tail: tuple[str, ...]) -> int | None:
        """The step a replica had reached: its SDK reports, else what its output printed."""
        name = rep.plan.name
        for step in (self.hangs.step_of(name), self.output_progress.step_of(name)):
            if step is not None:
                return step
        return last_step(tail)

    def of(
        self,
        replica: str,
        attempt: int,
        pid: int | None,
        time_s: float,
        c: Classification,
        tail: tuple[str, ...] = (),
        evidence: ExitEvidence | None = None,
    ) -> Failure:
        """The failure of `replica`'s current run."""
        rep = self.job.replicas[replica]
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
            progress=self.progress(rep, tail),
            uptime_s=None if rep.started_s is None else time_s - rep.started_s,
            evidence=evidence,
            node=rep.node,
        )

    def decide(self, failure: Failure) -> Decision:
        return decide_failure(
            self.spec.fault_tolerance,
            self.ledger.budgets,
            failure,
            len(self.job.replicas),
            wait_for_capacity=self.spec.queue.wait_for_capacity,
            roles=self.roles,
            groups_up=self.job.groups_up(self.roles, failure.replica),
        )

    def judge(self, failure: Failure) -> tuple[Decision, float]:
        """`decide`, the first time for this failure; with when (the detection time of its
        restart record)."""
        decision = self.decide(failure)
        return decision, self.clock()

    def record(self, root: Failure, decision: Decision) -> None:
        """Charge and write the root cause with the attempt's other failures (its cascade)."""
        self.ledger.failure(root, self.job.attempt_failures, decision)
        self.job.attempt_failures = []
        self.node_ledger.after_failure(root, NODE)  # across jobs (R-EVID-4)
