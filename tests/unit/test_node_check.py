"""The node check before a suspicious retry (issue 38), fast tier: which failures call for
it, how results are judged and bad nodes kept out (pure), a node's printed answer read, and
the master's hook against a fake backend (no processes; the real check on hosts and Slurm
is tests/e2e/test_node_check_slurm.py)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

from fakes import FakeBackend, make_master

from trainguard.backends.interface import NodeCheckOutcome, ReplicaExited, check_nodes
from trainguard.backends.node_check.run import CheckNotRun, run_check, worker_argv
from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.classify.readings import Finding, MachineReading
from trainguard.master.loop import Master
from trainguard.master.node_check import NODE_CHECK_EVENT
from trainguard.policy.node_check import (
    NodeReport,
    PairResult,
    Verdict,
    check_reason,
    describe_check,
    judge,
    keep_out,
    ring_pairs,
)
from trainguard.policy.probation import NodeEvent, NodeEventKind
from trainguard.records import nodes
from trainguard.records.rows import RestartRow
from trainguard.records.store import Store
from trainguard.states import JobState

NODES = ["n0", "n1", "n2"]


def _reason(returncode: int, *tail: str) -> str | None:
    return check_reason(classify_exit(ExitEvidence("w", returncode, log_tail=tail)))


def test_a_machine_s_failure_calls_for_a_check_and_a_bug_does_not() -> None:
    assert "network" in (_reason(1, "RuntimeError: Connection reset by peer") or "")
    assert "network" in (_reason(1, "Watchdog caught collective operation timeout") or "")
    assert "SIGSEGV" in (_reason(-11, "step 3") or "")
    assert "SIGBUS" in (_reason(-7) or "")
    lost = classify_exit(ExitEvidence("w", None, node_lost="slurmd unreachable"))
    assert check_reason(lost) is None  # named by the backend's probe, and kept out already
    assert _reason(1, "Traceback (most recent call last):", "ZeroDivisionError: x") is None
    assert _reason(1, "ModuleNotFoundError: No module named 'foo'") is None
    assert _reason(-9) is None  # a kill from outside says nothing of the machine
    xid = MachineReading("kmsg", "NVRM: Xid (PCI:0000:3b:00): 79", "GPU fell off the bus", True)
    bare = classify_exit(ExitEvidence("w", 1, log_tail=("step 3",)))
    assert check_reason(replace(bare, readings=(replace(xid, finding=Finding.XID),))) == (
        "the machine's evidence (kmsg: GPU fell off the bus)"
    )
    assert check_reason(replace(bare, readings=(xid,))) is None  # read, nothing wrong


def test_the_worlds_are_a_ring_of_pairs() -> None:
    assert ring_pairs(1) == ()
    assert ring_pairs(2) == ((0, 1),)
    assert ring_pairs(3) == ((0, 1), (1, 2), (2, 0))


def _report(compute_s: float = 0.05, ok: bool = True, **pairs: float | str) -> NodeReport:
    """pairs: w<index>=seconds, or an error text."""
    results = {
        int(k[1:]): PairResult(True, v) if isinstance(v, float) else PairResult(False, 0.0, v)
        for k, v in pairs.items()
    }
    return NodeReport(ok, compute_s, "" if ok else "wrong answer", results)


def _ring(times: dict[int, float | str]) -> dict[str, NodeReport | str]:
    """Three nodes whose worlds (0,1), (1,2), (2,0) took `times` (seconds or an error)."""
    return {
        "n0": _report(w0=times[0], w2=times[2]),
        "n1": _report(w0=times[0], w1=times[1]),
        "n2": _report(w1=times[1], w2=times[2]),
    }


def test_healthy_nodes_pass_and_jitter_under_the_floor_is_no_outlier() -> None:
    assert judge(NODES, _ring({0: 0.02, 1: 0.03, 2: 0.02})).passed
    # world (1,2) 5x the others, but 0.08 s: a busy machine's noise, and n1, n2 each have
    # a fast world besides
    assert judge(NODES, _ring({0: 0.02, 1: 0.1, 2: 0.02})).passed


def test_a_cut_node_is_the_one_whose_every_world_failed() -> None:
    err = "DistNetworkError: timed out"
    v = judge(NODES, _ring({0: err, 1: err, 2: 0.02}))
    assert list(v.bad) == ["n1"] and "failed with every peer" in v.bad["n1"]
    assert not v.unclear


def test_a_slowed_node_is_an_outlier_3x_the_median() -> None:
    v = judge(NODES, _ring({0: 0.02, 1: 2.5, 2: 2.4}))
    assert list(v.bad) == ["n2"] and "over 3x the median" in v.bad["n2"]


def test_a_silent_node_a_wrong_answer_and_a_slow_kernel_are_bad() -> None:
    reports = _ring({0: 0.02, 1: 0.02, 2: 0.02})
    reports["n1"] = "timed out after 20 s"
    assert judge(NODES, reports).bad["n1"] == "its check did not answer (timed out after 20 s)"
    reports = _ring({0: 0.02, 1: 0.02, 2: 0.02})
    reports["n2"] = _report(ok=False, w1=0.02, w2=0.02)
    assert "compute check failed (wrong answer)" in judge(NODES, reports).bad["n2"]
    reports = _ring({0: 0.02, 1: 0.02, 2: 0.02})
    reports["n0"] = _report(compute_s=1.5, w0=0.02, w2=0.02)
    assert "compute check took 1.50 s" in judge(NODES, reports).bad["n0"]


def test_of_two_nodes_whose_all_reduce_failed_neither_is_blamed() -> None:
    reports: dict[str, NodeReport | str] = {
        "n0": _report(w0="RuntimeError: Connection reset by peer"),
        "n1": _report(w0="RuntimeError: Connection reset by peer"),
    }
    v = judge(["n0", "n1"], reports)
    assert not v.bad and "every pair (n0, n1)" in v.unclear and not v.passed
    # and two nodes are never outliers of each other
    assert judge(["n0", "n1"], {"n0": _report(0.01, w0=0.01), "n1": _report(5.0, w0=9.0)}).passed


def test_a_bad_node_is_excluded_only_while_a_spare_is_left() -> None:
    v = Verdict({"n1": "its all-reduce failed with every peer (x)"})
    plan = keep_out(v, NODES, need=2)
    assert dict(plan.excluded) == {"n1": v.bad["n1"]} and not plan.kept
    text = describe_check("a network error", v, plan, 3.21)
    assert text.startswith("node check after a network error (3.2 s): n1 its all-reduce")
    assert text.endswith("excluded from later attempts")
    plan = keep_out(v, NODES, need=3)
    assert not plan.excluded and list(plan.kept) == ["n1"]
    assert "no spare node in the allocation, the job restarts on it" in describe_check(
        "x", v, plan, 1.0
    )


def _lines(*lines: object) -> list[str]:
    return [x if isinstance(x, str) else json.dumps(x) for x in lines]


def _check(
    printed: dict[str, list[str]], limit_s: float = 5.0, fail: tuple[str, ...] = ()
) -> tuple[dict[str, NodeReport | str], float]:
    """run_check over nodes that print `printed` (then hang, if they did not end with the
    whole report), or cannot start (`fail`); (reports, seconds it took)."""

    async def start(node: str, argv: Sequence[str], timeout_s: float) -> AsyncIterator[str]:
        if node in fail:
            raise CheckNotRun("srun: error: Task launch failed on node")
        for line in printed[node]:
            yield line
        if not printed[node] or '"pairs"' not in printed[node][-1]:
            await asyncio.sleep(3600)  # waits for a peer that never comes

    nodes = [(n, "addr") for n in (*printed, *fail)]
    t0 = time.monotonic()
    found = asyncio.run(run_check(nodes, start, limit_s=limit_s))
    return found, time.monotonic() - t0


COMPUTE = {"compute": {"compute_ok": True, "compute_s": 0.04, "kernel": "torch"}}


def test_a_node_s_lines_are_read_and_garbage_is_skipped() -> None:
    ok, boom = {"pair": 0, "ok": True, "seconds": 0.01}, {"pair": 2, "ok": False, "error": "boom"}
    printed = {
        "n0": _lines("a warning", COMPUTE, ok, "{not json", boom, {"pairs": {}}),
        "n1": _lines(COMPUTE, ok, {"pair": 1, "ok": True, "seconds": 0.02}, {"pairs": {}}),
        "n2": _lines(COMPUTE, {"pair": 1, "ok": True, "seconds": 0.02}, boom, {"pairs": {}}),
    }
    found, _ = _check(printed)
    r = found["n0"]
    assert isinstance(r, NodeReport) and r.kernel == "torch" and r.compute_s == 0.04
    assert r.pairs == {0: PairResult(True, 0.01), 2: PairResult(False, 0.0, "boom")}


def test_the_check_ends_once_every_node_said_what_it_can() -> None:
    """n2 could not start: n0 and n1 answer their world and wait for n2 in vain; the check
    ends at once, not at its limit."""
    printed = {
        "n0": _lines(COMPUTE, {"pair": 0, "ok": True, "seconds": 0.01}),
        "n1": _lines(COMPUTE, {"pair": 0, "ok": True, "seconds": 0.01}),
    }
    found, seconds = _check(printed, limit_s=30.0, fail=("n2",))
    assert seconds < 10  # the limit is 30 s
    assert found["n2"] == "srun: error: Task launch failed on node"
    v = judge(NODES, found)
    assert list(v.bad) == ["n2"] and "did not answer (srun: error" in v.bad["n2"]


def test_a_node_that_does_not_answer_in_time_is_timed_out() -> None:
    found, _ = _check({"n0": _lines(COMPUTE, {"pairs": {}}), "n1": []}, limit_s=0.05)
    assert found["n1"] == "timed out after 0.05 s"
    r = found["n0"]  # its world with n1 never ended
    assert isinstance(r, NodeReport) and not r.pairs[0].ok
    spec = json.loads(worker_argv(1, ["a", "b", "c"], [1, 2, 3], 20.0)[-1])
    assert spec["pairs"] == [[0, 1], [1, 2], [2, 0]] and spec["deadline_s"] == 19.0
    assert math.isclose(spec["collective_s"], 4.0)


def test_a_backend_without_a_check_says_so() -> None:
    out = asyncio.run(check_nodes(FakeBackend(), "a network error"))
    assert not out.ran and "not supported by FakeBackend" in out.note


class CheckingBackend(FakeBackend):
    """A fake backend whose node check finds what the test says (or raises)."""

    def __init__(self, outcome: NodeCheckOutcome | Exception) -> None:
        super().__init__()
        self.outcome = outcome
        self.checks: list[str] = []

    async def check_nodes(self, reason: str) -> NodeCheckOutcome:
        self.checks.append(reason)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


async def _drain(m: Master) -> None:
    while not m._queue.empty():
        await m.step(m._queue.get_nowait())


def _fail(be: FakeBackend, replica: str, returncode: int, *tail: str) -> None:
    launch = be.live.pop(replica)
    ev = ExitEvidence(replica, returncode, log_tail=tail, progressed=True)
    be.emit(ReplicaExited(launch.attempt, replica, launch.restart, 1, ev, 2.0))


async def _restarted_after_a_network_error(
    tmp_path: Path, be: FakeBackend
) -> tuple[Master, RestartRow, Store]:
    """A 2-worker job whose worker-1 fails with a network error, restarted: its record."""
    m, store = make_master(tmp_path, be)
    await m.begin()
    await _drain(m)
    _fail(be, "worker-1", 1, "RuntimeError: Connection reset by peer")
    await _drain(m)
    assert m.state is JobState.RUNNING and m.attempt == 1
    (rec,) = store.restarts_of("job-1")
    return m, rec, store


def _events(store: Store, kind: str) -> list[str]:
    rows = store.events_of("job-1")
    return [e.text or "" for e in rows if e.kind == kind]


def test_the_master_checks_the_nodes_before_retrying_a_network_error(tmp_path: Path) -> None:
    found = NodeCheckOutcome(
        "node check after x: n1 slow: excluded from later attempts", ("n1",), changed=True
    )

    async def scenario() -> None:
        be = CheckingBackend(found)
        m, rec, store = await _restarted_after_a_network_error(tmp_path, be)
        assert len(be.checks) == 1 and "network" in be.checks[0]
        assert rec.isolated == found.note
        assert _events(store, NODE_CHECK_EVENT) == [found.note]
        await m.shutdown()

    asyncio.run(scenario())


def test_a_bug_is_not_checked_and_a_check_that_cannot_run_is_recorded(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = CheckingBackend(RuntimeError("srun exploded"))
        m, store = make_master(tmp_path, be, fault_tolerance={"max_num_of_job_restart": 5})
        await m.begin()
        await _drain(m)
        _fail(be, "worker-0", -11)  # a bare SIGSEGV: checked; the check breaks
        await _drain(m)
        assert m.state is JobState.RUNNING and m.attempt == 1  # retried all the same
        (rec,) = store.restarts_of("job-1")
        assert rec.isolated is not None and "could not run: RuntimeError: srun" in rec.isolated
        assert len(be.checks) == 1
        await m.shutdown()

    asyncio.run(scenario())
    assert not check_reason(
        classify_exit(ExitEvidence("w", 1, log_tail=("ValueError: bad config",)))
    )


def test_a_backend_without_a_check_leaves_the_restart_record_alone(tmp_path: Path) -> None:
    async def scenario() -> None:
        m, rec, store = await _restarted_after_a_network_error(tmp_path, FakeBackend())
        assert rec.isolated is None
        (note,) = _events(store, NODE_CHECK_EVENT)
        assert "not supported by FakeBackend" in note
        await m.shutdown()

    asyncio.run(scenario())


def test_a_check_counts_against_the_node_it_left_out_and_forgives_one_that_passed(
    tmp_path: Path,
) -> None:
    """The node ledger hears the check: n1 failed it (a fault of that machine); n2, on
    probation, passed it and is used again."""
    found = NodeCheckOutcome("node check: n1 slow", ("n1",), changed=True, passed=("n2",))

    async def scenario() -> None:
        be = CheckingBackend(found)
        m, store = make_master(tmp_path, be)
        nodes.add(store, NodeEvent("n2", NodeEventKind.PROBATION, 1.0, reason="3 faults"))
        await m.begin()
        await _drain(m)
        _fail(be, "worker-1", 1, "RuntimeError: Connection reset by peer")
        await _drain(m)
        assert len(be.checks) == 1
        n1, n2 = nodes.state_of(store, "n1"), nodes.state_of(store, "n2")
        assert [e.rule for e in n1.faults] == ["node-check"] and not n1.on_probation
        assert not n2.on_probation
        assert n2.history[-1].kind is NodeEventKind.CHECK_PASSED
        await m.shutdown()

    asyncio.run(scenario())
