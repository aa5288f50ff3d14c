"""The master's side of the node ledger (R-EVID-4): it writes each failure that blames a
machine, carries out a probation the policy decides, and hands the backend the nodes to
avoid. The rules are `trainguard.policy.probation`; the rows `trainguard.records.nodes`.

A backend that can place replicas elsewhere implements `AvoidsNodes` (Slurm: a node on
probation is left out while the allocation has a spare, and drained where the spec
allows); the local backend has one machine and nothing to avoid. The ledger never stops a
job: a store that refuses its write is said, and the job goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from trainguard.backends.interface import NodeCheckOutcome
from trainguard.classify.classes import short_line
from trainguard.errors import StoreError
from trainguard.policy.budgets import Failure
from trainguard.policy.probation import (
    NodeEvent,
    NodeEventKind,
    machine_blame,
    probation_due,
)
from trainguard.records import nodes
from trainguard.records.recorder import Recorder
from trainguard.spec.models import JobSpec


@runtime_checkable
class AvoidsNodes(Protocol):
    def avoid_nodes(self, avoid: Mapping[str, str], drain: bool) -> None:
        """Keep these nodes (node -> why) out of later placements where there is a spare;
        `drain`: ask the scheduler to drain them too."""


class NodeLedger:
    def __init__(
        self,
        rec: Recorder,
        job_id: str,
        spec: JobSpec,
        backend: object,
        say: Callable[[str], None],
        clock: Callable[[], float],
    ) -> None:
        self.rec, self.store, self.job_id = rec, rec.store, job_id
        self.rule, self.backend_kind = spec.fault_tolerance.node_probation, spec.backend
        self.backend, self.say, self.clock = backend, say, clock

    def avoid_known(self, this_node: str) -> None:
        """At the job's start: the nodes already on probation are avoided."""
        try:
            bad = nodes.on_probation(self.store)
        except StoreError as exc:
            self.say(f"the node ledger could not be read ({exc}); no node is avoided")
            return
        if not bad:
            return
        if isinstance(self.backend, AvoidsNodes):
            self.backend.avoid_nodes(bad, drain=False)  # drained when it went on probation
            self.say(f"nodes on probation, avoided where a spare is left: {', '.join(bad)}")
        elif self.backend_kind == "local" and this_node in bad:
            self.say(f"this node ({this_node}) is on probation: {nodes.ONE_MACHINE}")

    def after_failure(self, f: Failure, this_node: str) -> None:
        """A root failure: recorded against its node if it blames the machine, and the
        node put on probation when the policy says so."""
        c = f.classification
        why = machine_blame(c)
        if why is None:
            return
        node = f.node or this_node
        fault = NodeEvent(
            node,
            NodeEventKind.FAULT,
            self.clock(),  # the master's clock, as the window is read with
            self.job_id,
            f.attempt,
            f.replica,
            c.failure_class.value if c.failure_class else None,
            c.rule,
            c.matched_line,
            why,
            self.backend_kind,
        )
        self._fault(fault)

    def after_check(self, outcome: NodeCheckOutcome, f: Failure) -> None:
        """A node check before a retry: a node it left out failed it (a fault of that
        machine); a node on probation that passed it is forgiven and used again."""
        now = self.clock()
        for node in outcome.excluded:
            why = f"failed the node check after {f.replica}'s failure"
            self._fault(
                NodeEvent(
                    node, NodeEventKind.FAULT, now, self.job_id, f.attempt, None,
                    None, "node-check", short_line(outcome.note, 400), why, self.backend_kind,
                )
            )  # fmt: skip
        for node in outcome.passed:
            try:
                if nodes.check_passed(self.store, node, now, short_line(outcome.note, 200)):
                    self.say(f"node {node} passed the node check: no longer on probation")
            except StoreError as exc:
                self.say(f"the node ledger could not record {node}'s check ({exc})")

    def _fault(self, fault: NodeEvent) -> None:
        node, now = fault.node, fault.at_s
        try:
            nodes.add(self.store, fault)
            decision = probation_due(nodes.state_of(self.store, node), self.rule, now)
            if decision is None:
                return
            entry = NodeEvent(
                node, NodeEventKind.PROBATION, now, self.job_id, reason=decision.reason
            )
            nodes.add(self.store, entry)
        except StoreError as exc:
            self.say(f"the node ledger could not record {node}'s fault ({exc})")
            return
        self.say(f"node {node} is on probation: {decision.reason}")
        if self.rec.notifier is not None:
            self.rec.notifier.emit(
                "node_probation",
                f"node {node} is on probation: {decision.reason}",
                node=node,
                reason=decision.reason,
            )
        if isinstance(self.backend, AvoidsNodes):
            self.backend.avoid_nodes({node: short_line(decision.reason, 200)}, self.rule.drain)
