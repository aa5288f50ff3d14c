"""The master loop driven one event at a time, asserting the `Transition` each turn returns:
capacity, exit hang, hang, give-up, injection and internal-error paths (issue 15).

Everything runs on the shared fake backend (tests/support/fakes.py); nothing starts a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import signal
from pathlib import Path

import pytest
from fakes import FakeBackend, FakeClock, make_master, pass_time

from trainguard.backends.interface import ReplicaOutput
from trainguard.hangs.watch import HangDetected
from trainguard.master.events import CapacityRetry, Transition
from trainguard.master.loop import Master
from trainguard.master.state import MasterState
from trainguard.policy.actions import Expire, FailJob, GiveUpReplica, Ignore, RestartJob, Succeed
from trainguard.policy.job_rules import JobView
from trainguard.records.explain import print_explain
from trainguard.records.queries import StoreReader
from trainguard.spec.models import JobSpec
from trainguard.states import JobState


async def _turns(m: Master) -> list[Transition]:
    """Every queued event through `step`, as the loop would; what each turn did."""
    out = []
    while not m._queue.empty():
        out.append(await m.step(m._queue.get_nowait()))
    return out


def _decided(turns: list[Transition]) -> list[str]:
    return [type(d).__name__ for t in turns for d in t.decisions]


def test_a_start_without_capacity_waits_then_expires(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        be.no_capacity = "no node has 8 GPUs"
        queue = {"wait_for_capacity": True, "capacity_retry_s": 0.01, "max_wait_s": 0.05}
        clock = FakeClock()
        m, store = make_master(tmp_path, be, clock, queue=queue)
        await m.begin()
        t0 = clock()
        assert m.state is JobState.RESTARTING and be.launches == []
        job = store.job("job-1")
        assert "waiting for capacity" in str(job.queued_reason)
        turns: list[Transition] = []
        for _ in range(200):  # CapacityRetry comes every 10 ms until max_wait_s is spent
            turns += await pass_time(m, clock, 0.01)
            if m.state.is_terminal:
                break
        assert m.state is JobState.EXPIRED  # type: ignore[comparison-overlap]
        assert 0.05 <= clock() - t0 < 0.07  # it expired at the first try past max_wait_s
        assert 5 <= _decided(turns).count("WaitForCapacity") <= 6  # a try every 10 ms
        assert {"WaitForCapacity", "Expire"} <= set(_decided(turns))
        last = turns[-1]
        assert isinstance(last.decision, Expire)
        assert (last.before, last.after) == (JobState.RESTARTING, JobState.EXPIRED)
        assert store.job("job-1").error_code == "EXPIRED"
        await m.shutdown()
        # explain lists each decision no failure led to, with the budget it ran against
        decisions = [d["text"] for d in StoreReader(store).explain("job-1")["decisions"]]
        assert decisions[0].startswith("WaitForCapacity: waiting for capacity (0 s so far")
        assert "max_wait_s 0.05), next try in 0.01 s: no node has 8 GPUs" in decisions[0]
        assert decisions[-1].startswith("Expire: waited 0 s for capacity, max_wait_s is 0.05")

    asyncio.run(scenario())


def test_a_start_without_capacity_fails_when_waiting_is_off(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        be.no_capacity = "no node has 8 GPUs"
        m, store = make_master(tmp_path, be)
        await m.begin()
        assert m.state is JobState.FAILED
        assert store.job("job-1").error_code == "CAPACITY"
        await m.shutdown()

    asyncio.run(scenario())


def test_a_run_whose_first_start_finds_no_capacity_ends_at_once(tmp_path: Path) -> None:
    """`run`, not `begin`: the loop ended the job at its first start, and waited for an
    event that never came (a Ray cluster too small, a machine without the GPUs asked)."""

    async def scenario() -> None:
        be = FakeBackend()
        be.no_capacity = "no node has 8 GPUs"
        m, store = make_master(tmp_path, be)
        await asyncio.wait_for(m.run(), 10)
        assert m.state is JobState.FAILED
        assert store.job("job-1").error_code == "CAPACITY"

    asyncio.run(scenario())


def test_output_nothing_reads_takes_no_turn_of_the_loop(tmp_path: Path) -> None:
    """Progress is read from worker-0's output alone: a line of worker-1 is not queued."""

    async def scenario() -> None:
        m, _ = make_master(tmp_path, FakeBackend())
        await m.begin()
        await _turns(m)
        m.post(ReplicaOutput(m.attempt, "worker-1", 0, ("step 3",), 1.0))
        assert m._queue.empty()
        m.post(ReplicaOutput(m.attempt, "worker-0", 0, ("step 3",), 1.0))
        assert m._queue.qsize() == 1
        await m.shutdown()

    asyncio.run(scenario())


def test_capacity_back_starts_the_attempt(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        be.no_capacity = "no capacity"
        m, _ = make_master(tmp_path, be, queue={"wait_for_capacity": True, "capacity_retry_s": 60})
        await m.begin()
        be.no_capacity = None
        t = await m.step(CapacityRetry(m.attempt))
        assert (t.before, t.decisions) == (JobState.RESTARTING, ())
        assert len(be.launches) == 2
        turns = await _turns(m)  # the two ReplicaStarted events
        assert turns[-1].after is JobState.RUNNING
        await m.shutdown()

    asyncio.run(scenario())


def test_a_start_builds_no_view_of_the_job_while_a_replica_is_still_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each start asks whether the attempt runs now; while a replica is still starting it
    does not, whatever the rest: 64 starts in any order build one view, not 64 of 64."""

    async def scenario() -> None:
        be = FakeBackend()
        pools = [{"role": "worker", "replicas": 64, "command": ["x"]}]
        m, _ = make_master(tmp_path, be, worker_pools=pools)
        views: list[JobView] = []
        view = MasterState.view

        def counted(job: MasterState, spec: JobSpec, all_done: bool = False) -> JobView:
            views.append(view(job, spec, all_done))
            return views[-1]

        monkeypatch.setattr(MasterState, "view", counted)
        await m.begin()
        started = m.actions.take_queued()
        random.Random(7).shuffle(started)
        for ev in started:
            m.post(ev)
        turns = await _turns(m)
        assert [t.after for t in turns] == [JobState.PENDING] * 63 + [JobState.RUNNING]
        assert len(views) == 1  # at the last start, which made it RUNNING
        await m.shutdown()

    asyncio.run(scenario())


def test_a_clean_exit_before_the_others_arms_the_exit_hang_timer(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        clock = FakeClock()
        m, _ = make_master(
            tmp_path,
            be,
            clock,
            success_policy="all",
            fault_tolerance={"job_exit_hang_interval_s": 0.5},
        )
        await m.begin()
        await _turns(m)
        for name in ("worker-0", "worker-1"):
            m.hangs.alive(name)  # both printed: no start-up allowance is left to wait for
        be.exit("worker-1", 0)
        (t,) = await _turns(m)
        assert isinstance(t.decision, Ignore) and t.after is JobState.RUNNING
        assert m.job.exit_hang_timer is not None
        assert await pass_time(m, clock, 0.49) == []  # the interval is not over yet
        turns = await pass_time(m, clock, 0.11)  # worker-0 never follows: an exit hang
        assert be.dumps == [["worker-0"]]  # the stacks of the one still running, canned
        decision = turns[0].decision
        assert isinstance(decision, RestartJob), turns
        assert "exit_hang" in decision.reason or "exit hang" in decision.reason.lower()
        await m.shutdown()

    asyncio.run(scenario())


def test_a_hang_restarts_the_job_and_a_second_at_the_same_point_fails_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        # 1 s after the fake replicas started: both hangs are in start-up, no step reached
        m, _ = make_master(tmp_path, be, FakeClock(2.0), fault_tolerance={"job_hang_interval_s": 1})
        await m.begin()
        await _turns(m)
        m.hangs.alive("worker-0")
        m.hangs.alive("worker-1")
        first = await m.step(HangDetected("hang", m.attempt, 1.0, 1.5, "worker-1"))
        assert isinstance(first.decision, RestartJob)
        assert (first.before, first.after) == (JobState.RUNNING, JobState.RESTARTING)
        await _turns(m)
        m.hangs.alive("worker-0")
        m.hangs.alive("worker-1")
        second = await m.step(HangDetected("hang", m.attempt, 1.0, 1.5, "worker-1"))
        assert isinstance(second.decision, FailJob)
        assert "the same error" in second.decision.reason  # the history rule
        await m.shutdown()

    asyncio.run(scenario())


def test_a_shard_that_cannot_be_retried_is_given_up_and_the_job_succeeds_in_part(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        pools = [{"role": "shard", "replicas": 2, "command": ["x"]}]
        m, store = make_master(
            tmp_path,
            be,
            framework="batch",
            worker_pools=pools,
            allow_partial=True,
            fault_tolerance={"max_replica_restarts": 0},
        )
        await m.begin()
        await _turns(m)
        be.exit("shard-1", 1)  # a bug: never retried
        (t,) = await _turns(m)
        assert isinstance(t.decision, GiveUpReplica) and t.after is JobState.RUNNING
        be.exit("shard-0", 0)
        turns = await _turns(m)
        done = turns[-1].decision
        assert isinstance(done, Succeed) and done.error_code == "PARTIAL"
        assert m.state is JobState.SUCCEEDED
        assert store.job("job-1").error_code == "PARTIAL"
        await m.shutdown()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            data = StoreReader(store).explain("job-1")
            print_explain(data["job"], data["failures"], data["decisions"])
        text = out.getvalue()
        assert "GiveUpReplica" in text  # shard-1's failure record
        assert "- decision     Succeed: partial success: 1 of 2 replicas succeeded" in text

    asyncio.run(scenario())


def test_an_injected_signal_goes_through_the_backend(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        clock = FakeClock()
        m, _ = make_master(tmp_path, be, clock, fault_injection=["signal:worker-1:SIGSEGV@0.01s"])
        await m.begin()
        await _turns(m)  # RUNNING: the injection's clock starts
        await pass_time(m, clock, 0.009)
        assert be.signals == []  # not before its time
        await pass_time(m, clock, 0.041)
        assert be.signals == [("worker-1", signal.SIGSEGV)]
        await m.shutdown()

    asyncio.run(scenario())


def test_an_internal_error_restarts_within_its_budget_then_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make_master(tmp_path, be, fault_tolerance={"max_internal_restarts": 1})
        await m.begin()
        await _turns(m)
        assert await m._internal_error(RuntimeError("boom")) is True  # a new attempt next
        assert m.state is JobState.RESTARTING
        assert await m._internal_error(RuntimeError("boom again")) is False
        assert m.state is JobState.FAILED  # type: ignore[comparison-overlap]
        assert store.job("job-1").error_code == "INTERNAL"
        await m.shutdown()

    asyncio.run(scenario())


def test_step_returns_no_decision_for_an_event_that_needs_none(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = make_master(tmp_path, be)
        await m.begin()
        turns = await _turns(m)
        assert [t.decisions for t in turns] == [(), ()]
        assert (turns[0].before, turns[-1].after) == (JobState.PENDING, JobState.RUNNING)
        assert m._queue.empty()  # nothing else queued
        await m.shutdown()

    asyncio.run(scenario())
