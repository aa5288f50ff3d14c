"""Which failures blame the machine, and when a node goes on probation (R-EVID-4). Pure.

A failure counts against its node only when its verdict points at the machine, never at
the job (a fault of the job would put every node it touches on probation):

- a lost node (`node_lost`): the machine under the replica died or was cut off;
- a hardware verdict (`hardware`: a catalogue signature of the device or node, as an
  NVIDIA Xid, an ECC error, a GPU fallen off the bus, a bare segfault the evidence reads
  as hardware);
- a host OOM that the evidence says came from outside the job's own limit (the machine's
  other tenants): `oom_outside_job` is True. An OOM over the replica's own
  `resources.memory`, or one the evidence cannot place, is the job's own.

Never: a cascade (it follows another replica's death), a bug, a configuration or usage
error, a device OOM (the job's own allocation), a preemption or external kill (the
scheduler's or a person's), a hang, an internal error of trainguard, a capacity shortage,
a bare SIGSEGV/SIGBUS that nothing reads as hardware (most are bugs of native code).

A node goes on probation when `faults` such failures fall within `window_s` and come from
at least `jobs` different jobs, all since it was last forgiven (released by a person, or a
node check that passed). Probation lasts until it is forgiven: the window only decides
when it begins. Decisions are values; the master records, notifies and avoids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from trainguard.classify.classes import Classification, FailureClass
from trainguard.spec.node_probation import NodeProbation
from trainguard.spec.text import counted


def machine_blame(c: Classification, *, oom_outside_job: bool | None = None) -> str | None:
    """Why this failure counts against its node, or None when it is no machine's fault."""
    if not c.is_failure or c.cascade:
        return None
    if c.failure_class is FailureClass.NODE_LOST:
        return f"node lost: {c.reason}"
    if c.hardware:
        return f"hardware fault ({c.rule})" + (f": {c.matched_line}" if c.matched_line else "")
    if c.failure_class is FailureClass.HOST_OOM and oom_outside_job is True:
        return "host out of memory outside the job's own limit"
    return None


class NodeEventKind(StrEnum):
    """What a node ledger row says (one table, read in order)."""

    FAULT = "fault"  # a failure that blames the machine
    PROBATION = "probation"  # it went on probation: avoided until forgiven
    RELEASED = "released"  # a person forgave it (`trainguard nodes release`)
    CHECK_PASSED = "check_passed"  # a node check passed on it: forgiven too


FORGIVING = frozenset({NodeEventKind.RELEASED, NodeEventKind.CHECK_PASSED})


@dataclass(frozen=True)
class NodeEvent:
    """One ledger row: a fault with its evidence, or a change of the node's state."""

    node: str
    kind: NodeEventKind
    at_s: float
    job_id: str | None = None
    attempt: int | None = None
    replica: str | None = None
    failure_class: str | None = None
    rule: str | None = None
    matched_line: str | None = None
    reason: str | None = None  # why it blames the machine, or why the state changed
    backend: str | None = None  # where it ran: local, slurm, ray


@dataclass(frozen=True)
class EnterProbation:
    """The decision: `node` goes on probation, for `reason` (names the faults)."""

    node: str
    reason: str


@dataclass(frozen=True)
class NodeState:
    """A node's standing, from its ledger rows (oldest first)."""

    node: str
    on_probation: bool
    since_s: float | None  # when its probation began
    reason: str | None  # why it is on probation
    faults: tuple[NodeEvent, ...]  # every fault since it was last forgiven
    history: tuple[NodeEvent, ...]  # every row, oldest first

    @property
    def needs_check(self) -> bool:
        """A node on probation is used again only once a node check passes on it."""
        return self.on_probation


def node_state(node: str, events: Sequence[NodeEvent]) -> NodeState:
    """Fold a node's rows, in the order they were written (masters on other machines
    stamp them with their own clocks): faults since its last forgiveness, and whether a
    probation row came after it."""
    ordered = list(events)
    faults: list[NodeEvent] = []
    probation: NodeEvent | None = None
    for e in ordered:
        if e.kind in FORGIVING:
            faults, probation = [], None
        elif e.kind is NodeEventKind.FAULT:
            faults.append(e)
        elif e.kind is NodeEventKind.PROBATION:  # the latest (two masters may race)
            probation = e
    return NodeState(
        node,
        probation is not None,
        probation.at_s if probation else None,
        probation.reason if probation else None,
        tuple(faults),
        tuple(ordered),
    )


def probation_due(state: NodeState, rule: NodeProbation, now_s: float) -> EnterProbation | None:
    """Whether a node not yet on probation goes on it now: `rule.faults` faults since it
    was forgiven, within `rule.window_s` of now, from `rule.jobs` jobs or more."""
    if state.on_probation:
        return None
    recent = [f for f in state.faults if now_s - f.at_s <= rule.window_s]
    jobs = {f.job_id for f in recent if f.job_id}
    if len(recent) < rule.faults or len(jobs) < rule.jobs:
        return None
    hours = rule.window_s / 3600
    why = (
        f"{counted(len(recent), 'machine-blamed failure')} within {hours:g} h from "
        f"{counted(len(jobs), 'job')} "
        f"(probation at {rule.faults} from {rule.jobs}); last: {recent[-1].reason}"
    )
    return EnterProbation(state.node, why)
