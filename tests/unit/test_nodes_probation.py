"""The node ledger (R-EVID-4), without processes: which verdicts blame the machine (a table
over real classifications), when a node goes on probation (a table), the ledger's queries on
a real SQLite store, the master writing it through a fake backend, and the settings."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBackend, FakeClock

from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.errors import SpecError
from trainguard.master.loop import Master
from trainguard.policy.probation import (
    FORGIVING,
    NodeEvent,
    NodeEventKind,
    machine_blame,
    node_state,
    probation_due,
)
from trainguard.records import nodes
from trainguard.records.recorder import NODE, Recorder
from trainguard.records.store import Store
from trainguard.spec.models import validate_spec
from trainguard.spec.node_probation import NodeProbation

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)"
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
BUG = ("Traceback (most recent call last):", '  File "t.py", line 3, in <module>', "KeyError: 'x'")
CASCADE = (
    "torch.distributed.DistBackendError: NCCL error: "
    "remote process exited or there was a network error",
)


def _ev(code: int | None, *tail: str, **kw: Any) -> ExitEvidence:
    return ExitEvidence("worker-1", code, log_tail=tail, progressed=True, **kw)


# ---------------------------------------------------------------- which failures blame a node


@pytest.mark.parametrize(
    ("what", "ev", "outside", "blamed"),
    [
        ("a GPU fallen off the bus (Xid 79)", _ev(1, XID_79), None, "hardware fault (gpu-xid)"),
        ("an uncorrectable ECC error", _ev(1, ECC), None, "hardware fault (gpu-ecc)"),
        ("a lost node", _ev(None, node_lost="slurmd of n2 unreachable"), None, "node lost"),
        ("Xid 13: most often the job's own bad access", _ev(1, XID_13), None, None),
        ("a bug of the job", _ev(1, *BUG), None, None),
        ("a bare segfault nothing reads as hardware", _ev(-11), None, None),
        ("a SIGBUS with nothing said", _ev(-7), None, None),
        ("a host OOM of its own cgroup", _ev(-9, oom_kills=1), None, None),
        ("a host OOM the evidence places outside the job", _ev(-9, oom_kills=1), True, "host"),
        ("an OOM the job's own limit explains", _ev(-9, oom_kills=1), False, None),
        ("a kill from outside (preemption-like)", _ev(-15), None, None),
        ("a peer's cascade", _ev(1, *CASCADE), None, None),
        ("a stop the master asked for", _ev(-15, stop_requested=True), None, None),
        ("a clean exit", _ev(0), None, None),
        ("a command that cannot start", _ev(None, spawn_error="No such file"), None, None),
    ],
)
def test_which_failures_blame_the_machine(
    what: str, ev: ExitEvidence, outside: bool | None, blamed: str | None
) -> None:
    why = machine_blame(classify_exit(ev), oom_outside_job=outside)
    if blamed is None:
        assert why is None, what
    else:
        assert why is not None and why.startswith(blamed), (what, why)


def test_a_cascade_never_blames_its_node_whatever_it_printed() -> None:
    """A replica dying because its peer did may print the peer's hardware error: the
    root cause's node is blamed, not the survivor's."""
    hardware = classify_exit(_ev(1, XID_79))
    assert machine_blame(hardware) is not None
    assert machine_blame(replace(hardware, cascade=True)) is None


# ---------------------------------------------------------------- when a node goes on probation

H = 3600.0


def _fault(at_h: float, job: str, node: str = "n1") -> NodeEvent:
    return NodeEvent(node, NodeEventKind.FAULT, at_h * H, job, 0, "worker-0", reason="xid")


def _mark(kind: NodeEventKind, at_h: float) -> NodeEvent:
    return NodeEvent("n1", kind, at_h * H, reason=kind.value)


_MARKS = {"R": NodeEventKind.RELEASED, "C": NodeEventKind.CHECK_PASSED}
_MARKS["P"] = NodeEventKind.PROBATION


def _rows(text: str) -> list[NodeEvent]:
    """ "0a 1b R1.5": a fault of job a at 0 h, of job b at 1 h, a release at 1.5 h."""
    out = []
    for tok in text.split():
        if tok[0] in _MARKS:
            out.append(_mark(_MARKS[tok[0]], float(tok[1:])))
        else:
            out.append(_fault(float(tok[:-1]), tok[-1]))
    return out


@pytest.mark.parametrize(
    ("what", "rows", "now_h", "due"),
    [
        ("3 faults from 2 jobs within 24 h", "0a 1a 2b", 3, True),
        ("3 faults of one job", "0a 1a 2a", 3, False),
        ("2 faults from 2 jobs", "0a 1b", 2, False),
        ("the first fault left the window", "0a 20a 25b", 25, False),
        ("3 in the window, of 4 in all", "0a 20a 21b 22c", 25, True),
        ("released after 2: the third starts afresh", "0a 1b R1.5 2c", 3, False),
        ("a check passed forgives as a release does", "0a 1b C1.5 2c", 3, False),
        ("already on probation: not again", "0a 1a 2b P2", 3, False),
        ("forgiven, then 3 more from 2 jobs", "0a 1b 2c C3 4a 5a 6d", 7, True),
    ],
)
def test_when_a_node_goes_on_probation(what: str, rows: str, now_h: float, due: bool) -> None:
    decision = probation_due(node_state("n1", _rows(rows)), NodeProbation(), now_h * H)
    assert (decision is not None) is due, what
    if decision is not None:
        assert decision.node == "n1" and "3 machine-blamed failures within 24 h" in decision.reason


def test_a_probation_after_one_fault_says_so_in_the_singular() -> None:
    decision = probation_due(node_state("n1", _rows("0a")), NodeProbation(faults=1, jobs=1), H)
    assert decision is not None
    assert decision.reason.startswith("1 machine-blamed failure within 24 h from 1 job (")


def test_probation_outlives_its_window_until_forgiven() -> None:
    rows = _rows("0a 1a 2b P2")
    state = node_state("n1", rows)
    assert state.on_probation and state.needs_check and state.since_s == 2 * H
    assert node_state("n1", [*rows, _mark(NodeEventKind.CHECK_PASSED, 100)]).on_probation is False


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"faults": 0}, "faults"),
        ({"faults": 2, "jobs": 3}, "jobs (3) cannot exceed faults (2)"),
        ({"window_s": 0}, "window_s"),
        ({"window_s": 10**9}, "window_s"),
        ({"jobs": True}, "jobs"),
        ({"drain": "maybe"}, "drain"),
        ({"k": 3}, "k"),
    ],
)
def test_the_settings_are_validated_in_one_line_naming_the_field(
    settings: dict[str, Any], says: str
) -> None:
    spec = {
        "name": "t",
        "worker_pools": [{"role": "worker", "replicas": 1, "command": ["x"]}],
        "fault_tolerance": {"node_probation": settings},
    }
    with pytest.raises(SpecError) as err:
        validate_spec(spec)
    (line,) = err.value.problems
    assert "node_probation" in line and says in line and "\n" not in line


# ---------------------------------------------------------------- the ledger on a real store


def test_the_ledger_keeps_faults_with_their_evidence_and_forgives(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    assert nodes.nodes_view(store) == []
    ev = NodeEvent("n1", NodeEventKind.FAULT, 10.0, "job-a", 2, "worker-1", "retryable_message",
                   "gpu-xid", XID_79, "hardware fault (gpu-xid)", "slurm")  # fmt: skip
    nodes.add(store, ev)
    nodes.add(store, NodeEvent("n1", NodeEventKind.PROBATION, 11.0, "job-a", reason="3 faults"))
    nodes.add(store, NodeEvent("n2", NodeEventKind.FAULT, 12.0, "job-b", backend="local"))
    assert nodes.on_probation(store) == {"n1": "3 faults"}
    (n1, n2) = nodes.nodes_view(store)
    assert (n1["node"], n1["state"], n1["needs_check"], n1["faults"]) == (
        "n1",
        "probation",
        True,
        1,
    )
    fault = n1["history"][0]
    assert (fault["job_id"], fault["attempt"], fault["replica"]) == ("job-a", 2, "worker-1")
    assert (fault["rule"], fault["matched_line"], fault["at_s"]) == ("gpu-xid", XID_79, 10.0)
    assert n2["state"] == "ok" and n2["note"] == nodes.ONE_MACHINE
    assert n1["note"] is None  # Slurm can place elsewhere

    assert nodes.check_passed(store, "n2", 13.0) is False  # not on probation: nothing written
    assert nodes.check_passed(store, "n1", 14.0, "all-reduce ok") is True
    assert nodes.on_probation(store) == {}
    assert nodes.state_of(store, "n1").faults == ()

    released = nodes.release(store, "n2", 15.0, "ops@host")
    assert released.history[-1].reason == "released by ops@host"
    with pytest.raises(
        nodes.NodeNotFound, match=r"no node 'n9' in the node ledger \(known: n1, n2\)"
    ):
        nodes.release(store, "n9", 16.0)


def test_a_local_node_on_probation_says_there_is_nothing_to_avoid(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    nodes.add(store, NodeEvent("box", NodeEventKind.FAULT, 1.0, "a", backend="local"))
    nodes.add(store, NodeEvent("box", NodeEventKind.PROBATION, 2.0, "a", reason="r"))
    (view,) = nodes.nodes_view(store)
    assert view["note"] == nodes.ONE_MACHINE
    nodes.add(store, NodeEvent(NODE, NodeEventKind.PROBATION, 3.0, "a", reason="r"))
    said: list[str] = []
    _job(tmp_path, "job-x", FakeBackend(), said.append)
    assert f"this node ({NODE}) is on probation: {nodes.ONE_MACHINE}" in said


# ---------------------------------------------------------------- the master writes it


class AvoidingBackend(FakeBackend):
    """A backend that can place elsewhere: records what it was told to avoid."""

    def __init__(self) -> None:
        super().__init__()
        self.avoided: list[tuple[dict[str, str], bool]] = []

    def avoid_nodes(self, avoid: Mapping[str, str], drain: bool) -> None:
        self.avoided.append((dict(avoid), drain))


async def _drain(master: Master) -> None:
    while not master._queue.empty():
        await master.step(master._queue.get_nowait())


def _job(
    tmp_path: Path, job: str, be: FakeBackend, say: Callable[[str], None] | None = None, **ft: Any
) -> Master:
    """A master of job `job` (2 workers) on the store every job here shares."""
    spec = validate_spec(
        {
            "name": job,
            "worker_pools": [{"role": "worker", "replicas": 2, "command": ["x"]}],
            "fault_tolerance": ft,
        }
    )
    rec = Recorder(Store(tmp_path / "home"), job)
    logs = tmp_path / job
    rec.job_created(name=job, spec=spec, log_dir=logs, at_s=0.0, master={})
    clock = FakeClock()  # its time and timers: nothing fires unless a test advances it
    return Master(
        job_id=job,
        spec=spec,
        backend=be,
        recorder=rec,
        log_dir=logs,
        cwd=str(tmp_path),
        say=say or (lambda _m: None),
        clock=clock,
        timers=clock,
    )


def test_the_failure_is_said_before_the_probation_it_leads_to(tmp_path: Path) -> None:
    said: list[str] = []

    async def run() -> None:
        be = FakeBackend()
        be.nodes = {"worker-0": "n0", "worker-1": "n1"}
        m = _job(tmp_path, "job-a", be, said.append, node_probation={"faults": 1, "jobs": 1})
        await m.begin()
        await _drain(m)
        be.exit("worker-1", 1, log_tail=(XID_79,))
        await _drain(m)
        await m.shutdown()

    asyncio.run(run())
    failed = next(i for i, s in enumerate(said) if s.startswith("worker-1 failed"))
    probation = next(i for i, s in enumerate(said) if s.startswith("node n1 is on probation"))
    assert failed < probation, said


def test_three_machine_faults_of_two_jobs_put_the_node_on_probation(tmp_path: Path) -> None:
    notified: list[tuple[str, str, dict[str, Any]]] = []

    class Notes:
        def emit(self, kind: str, text: str, **fields: Any) -> None:
            notified.append((kind, text, fields))

    async def one_job(job: str, failures: int, tail: tuple[str, ...], **ft: Any) -> AvoidingBackend:
        be = AvoidingBackend()
        be.nodes = {"worker-0": "n0", "worker-1": "n1"}
        m = _job(tmp_path, job, be, **ft)
        m.rec.notifier = Notes()  # type: ignore[assignment]
        await m.begin()
        await _drain(m)
        for _ in range(failures):
            be.exit("worker-1", 1, log_tail=tail)
            await _drain(m)
        await m.shutdown()
        return be

    store = Store(tmp_path / "home")
    await_ = asyncio.run
    await_(one_job("job-a", 2, (XID_79,), node_probation={"drain": True}))
    await_(one_job("job-b", 1, BUG))  # the job's own bug: never the node's
    assert nodes.on_probation(store) == {} and nodes.state_of(store, "n1").faults != ()
    assert len(nodes.state_of(store, "n1").faults) == 2
    assert not [n for n in notified if n[0] == "node_probation"]
    be = await_(one_job("job-c", 1, (ECC,), node_probation={"drain": True}))
    assert list(nodes.on_probation(store)) == ["n1"]
    ((avoid, drain),) = be.avoided
    assert list(avoid) == ["n1"] and drain is True
    (note,) = [n for n in notified if n[0] == "node_probation"]
    assert note[0] == "node_probation" and note[2]["node"] == "n1"
    assert "3 machine-blamed failures" in note[1] and "from 2 jobs" in note[1]
    assert nodes.state_of(store, "n0").history == ()  # the healthy peer has no row

    later = await_(one_job("job-d", 0, ()))  # the next job is told to avoid n1 at once
    assert later.avoided == [({"n1": nodes.on_probation(store)["n1"]}, False)]


def test_the_nodes_on_probation_read_in_sql_are_the_fold_of_every_row(tmp_path: Path) -> None:
    """`on_probation` asks SQL for each node's last change of standing (it runs at every
    job's start); it must agree with folding every row, whatever the order of events."""
    store = Store(tmp_path / "home")
    rnd = random.Random(38)
    kinds = [NodeEventKind.FAULT] * 3 + [NodeEventKind.PROBATION, *FORGIVING]
    for i in range(400):
        kind = rnd.choice(kinds)
        node = f"n{rnd.randrange(12)}"
        nodes.add(store, NodeEvent(node, kind, rnd.uniform(0, 100), f"j{i % 5}", reason=f"r{i}"))
    folded = {s.node: s.reason for s in nodes.states(store) if s.on_probation}
    assert folded and nodes.on_probation(store) == folded
