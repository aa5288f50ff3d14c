"""The master loop driven event by event against a fake backend (no processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBackend, make_master

from trainguard.backends.interface import Launch, ReplicaExited
from trainguard.classify.classes import INTERNAL_ERROR_MESSAGE, ExitEvidence
from trainguard.master.events import CancelRequested
from trainguard.master.loop import Master
from trainguard.records.store import Store
from trainguard.states import JobState


def make(
    tmp_path: Path, backend: FakeBackend, replicas: int = 2, **ft: object
) -> tuple[Master, Store]:
    pools = [{"role": "worker", "replicas": replicas, "command": ["x"]}]
    return make_master(tmp_path, backend, worker_pools=pools, fault_tolerance=ft)


async def drain(master: Master) -> None:
    """Run every queued event through `step`, as the loop would."""
    while not master._queue.empty():
        await master.step(master._queue.get_nowait())


def test_transient_failure_restarts_the_whole_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        assert m.state is JobState.RUNNING and m.attempt == 0
        be.exit("worker-1", -11)
        await drain(m)
        assert m.state is JobState.RUNNING and m.attempt == 1
        assert be.stops[0] == ["worker-0"]  # the survivor was stopped
        ports = {launch.env["MASTER_PORT"] for launch in be.launches}
        assert len(ports) == 2
        assert [launch.env["TORCHELASTIC_RESTART_COUNT"] for launch in be.launches[2:]] == [
            "1",
            "1",
        ]
        assert m.budgets.job_restarts == 1
        assert m.budgets.class_restarts == {"max_transient_restarts": 1}
        (rec,) = store.restarts_of("job-1")
        assert rec.failure_class == "transient_exit" and rec.error_code == "139"
        assert rec.stop_ms is not None and rec.start_ms is not None
        states = [t.to_state for t in store.transitions_of("job-1")]
        assert states == ["PENDING", "RUNNING", "RESTARTING", "RUNNING"]
        runs = store.runs_of("job-1", attempt=0)
        assert {r.replica: r.state for r in runs} == {
            "worker-0": "STOPPED",
            "worker-1": "FAILED",
        }
        await m.shutdown()

    asyncio.run(scenario())


def test_budget_runs_out_then_the_job_fails_with_the_last_message(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = make(tmp_path, be, max_num_of_job_restart=2, enable_repeat_detection=False)
        await m.begin()
        await drain(m)
        for _ in range(3):
            be.exit("worker-0", 134)
            await drain(m)
        assert m.state is JobState.FAILED
        assert m.outcome.error_message == (
            "The replica worker-0 exited with a non-zero status of 134. "
            "Termination reason: SIGABRT. (proof: max_num_of_job_restart is spent (2/2))"
        )
        assert m.outcome.attempts == 3
        await m.shutdown()

    asyncio.run(scenario())


def test_exits_of_an_old_attempt_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        old = be.live["worker-0"]
        be.exit("worker-1", -9)
        await drain(m)
        # a late failure report from attempt 0 arrives after attempt 1 started
        ev = ExitEvidence("worker-0", 1, log_tail=("Traceback (most recent call last):", "E: x"))
        await m.step(ReplicaExited(old.attempt, "worker-0", 0, 1, ev, 3.0))
        assert m.state is JobState.RUNNING and m.attempt == 1
        assert len(store.restarts_of("job-1")) == 1
        await m.shutdown()

    asyncio.run(scenario())


class QuickExitBackend(FakeBackend):
    """Like Ray's: replicas start one by one, and one may be done before the next starts."""

    def __init__(self, codes: dict[int, int], who: str = "") -> None:
        super().__init__()
        self.codes = codes  # attempt -> the exit code of its replicas (of `who` alone if set)
        self.who = who

    async def start(self, launches: Sequence[Launch]) -> None:
        for launch in launches:
            await super().start([launch])
            if launch.attempt in self.codes and self.who in ("", launch.replica):
                self.exit(launch.replica, self.codes[launch.attempt])


@pytest.mark.parametrize("code", [0, 1])
def test_replicas_that_exit_while_the_next_ones_start_are_decided(
    tmp_path: Path, code: int
) -> None:
    """A restarted attempt whose replicas end at once must end the job, not stall it."""

    async def scenario() -> None:
        be = QuickExitBackend({1: code})
        m, store = make(tmp_path, be, max_num_of_job_restart=1)
        await m.begin()
        await drain(m)
        be.exit("worker-1", -9)
        await drain(m)
        assert m.attempt == 1
        assert m.state is (JobState.SUCCEEDED if code == 0 else JobState.FAILED)
        states = [t.to_state for t in store.transitions_of("job-1")]
        assert states[:3] == ["PENDING", "RUNNING", "RESTARTING"]
        await m.shutdown()

    asyncio.run(scenario())


def test_a_job_runs_when_one_replica_is_done_before_the_last_starts(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = QuickExitBackend({0: 0}, who="worker-1")  # done before worker-2 starts
        m, store = make(tmp_path, be, replicas=3)
        await m.begin()
        await drain(m)
        assert m.state is JobState.RUNNING
        (t,) = [t for t in store.transitions_of("job-1") if t.to_state == "RUNNING"]
        assert t.reason == "attempt 0: all 3 replicas started, 1 already exited"
        await m.shutdown()

    asyncio.run(scenario())


def test_cancel_stops_everything_and_charges_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        await m.step(CancelRequested("test"))
        assert m.state is JobState.CANCELLED
        assert be.live == {}
        assert m.budgets.job_restarts == 0 and store.restarts_of("job-1") == []
        states = [t.to_state for t in store.transitions_of("job-1")]
        assert states[-2:] == ["CANCELLING", "CANCELLED"]
        await m.shutdown()

    asyncio.run(scenario())


def test_async_mode_restarts_only_the_failed_worker(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be, execution_mode="async")
        await m.begin()
        await drain(m)
        be.exit("worker-1", -11)
        await drain(m)
        assert m.attempt == 0 and be.stops == []
        relaunch = be.launches[-1]
        assert (relaunch.replica, relaunch.restart) == ("worker-1", 1)
        assert relaunch.log_path.name == "worker-1.r1.log"
        assert m.budgets.replica_restarts == {"worker-1": 1}
        (rec,) = store.restarts_of("job-1")
        assert str(rec.decision).startswith("RestartReplica(worker-1)")
        await m.shutdown()

    asyncio.run(scenario())


def test_primary_success_ends_the_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = make(tmp_path, be)
        await m.begin()
        await drain(m)
        be.exit("worker-1", 0)
        await drain(m)
        assert m.state is JobState.RUNNING  # worker-1 is not the primary
        be.exit("worker-0", 0)
        await drain(m)
        assert m.state is JobState.SUCCEEDED  # type: ignore[comparison-overlap]  # await moved it
        await m.shutdown()

    asyncio.run(scenario())


def test_a_backend_fault_is_an_internal_error(tmp_path: Path) -> None:
    be = FakeBackend(fail_start=True)
    m, store = make(tmp_path, be)
    outcome = asyncio.run(m.run())
    assert outcome.state is JobState.FAILED
    assert outcome.error_message == INTERNAL_ERROR_MESSAGE
    # retried twice (3 attempts in all), as Vertex does with internal errors
    assert (outcome.attempts, outcome.restarts) == (3, 2)
    assert [r.failure_class for r in store.restarts_of("job-1")] == ["internal"] * 2
    assert store.job("job-1").error_code == "INTERNAL"
    assert "backend exploded" in (tmp_path / "logs" / "master-error.log").read_text()
    assert be.closed


def test_root_cause_is_the_earliest_non_cascade_failure(tmp_path: Path) -> None:
    """The cascade (a connection reset) is seen first; the KeyError that caused it wins."""

    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        w0, w1 = be.live.pop("worker-0"), be.live.pop("worker-1")
        reset = ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer",)
        bug = ("Traceback (most recent call last):", '  File "t.py", line 1', "KeyError: 'lr'")
        be.emit(
            ReplicaExited(0, "worker-0", 0, 1, ExitEvidence("worker-0", 1, log_tail=reset), 2.0)
        )
        be.emit(ReplicaExited(0, "worker-1", 0, 2, ExitEvidence("worker-1", 1, log_tail=bug), 1.9))
        assert (w0.replica, w1.replica) == ("worker-0", "worker-1")
        await drain(m)
        assert m.state is JobState.FAILED
        assert m.outcome.error_message == (
            "The replica worker-1 exited with a non-zero status of 1. "
            "Termination reason: KeyError: 'lr'. "
            "(proof: rule python-bug, a Python exception in the job's own code)"
        )
        failures = store.failures_of("job-1")
        assert [(f.replica, f.root_cause, f.cascade_of) for f in failures] == [
            ("worker-1", True, None),
            ("worker-0", False, "worker-1"),
        ]
        assert store.restarts_of("job-1") == []
        await m.shutdown()

    asyncio.run(scenario())


def test_a_replica_stopped_after_its_own_traceback_is_still_the_root_cause(
    tmp_path: Path,
) -> None:
    """On a busy machine the master's stop can overtake a replica dying of a KeyError."""

    class SlowToDie(FakeBackend):
        async def stop(self, replicas: Any, grace_s: float) -> None:
            self.stops.append(list(replicas))
            for name in replicas:
                launch = self.live.pop(name, None)
                if launch is not None:  # it had printed its traceback, the stop came first
                    bug = ("Traceback (most recent call last):", "KeyError: 'lr'", "")
                    ev = ExitEvidence(name, -15, stop_requested=True, log_tail=bug)
                    self.emit(ReplicaExited(launch.attempt, name, 0, 2, ev, 2.1))

    async def scenario() -> None:
        be = SlowToDie()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        launch = be.live.pop("worker-0")
        reset = ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer",)
        ev = ExitEvidence("worker-0", -6, log_tail=reset, progressed=True)
        be.emit(ReplicaExited(launch.attempt, "worker-0", 0, 1, ev, 2.0))
        await drain(m)
        assert m.state is JobState.FAILED and m.attempt == 0
        roots = [f for f in store.failures_of("job-1") if f.root_cause]
        assert [(f.replica, f.rule) for f in roots] == [("worker-1", "python-bug")]
        assert store.restarts_of("job-1") == []
        await m.shutdown()

    asyncio.run(scenario())


def test_a_cascade_alone_is_retried_and_recorded(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        be.exit("worker-0", -9)  # killed from outside
        reset = ("RuntimeError: Connection reset by peer",)
        launch = be.live.pop("worker-1")
        ev = ExitEvidence("worker-1", 1, log_tail=reset)
        be.emit(ReplicaExited(launch.attempt, "worker-1", 0, 2, ev, 2.5))
        await drain(m)
        assert m.state is JobState.RUNNING and m.attempt == 1
        (rec,) = store.restarts_of("job-1")
        assert (rec.replica, rec.failure_class, rec.cascade) == (
            "worker-0",
            "preemption",
            "worker-1",
        )
        await m.shutdown()

    asyncio.run(scenario())


def test_a_restart_record_names_the_node_the_failure_was_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        be.nodes = {"worker-0": "10.0.0.2/ab12cd34", "worker-1": "10.0.0.3/ef56ab78"}
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        be.exit("worker-1", -9)
        await drain(m)
        (rec,) = store.restarts_of("job-1")
        assert (rec.replica, rec.node) == ("worker-1", "10.0.0.3/ef56ab78")
        await m.shutdown()

    asyncio.run(scenario())


def test_a_crash_at_exit_after_the_peers_finished_is_retried(tmp_path: Path) -> None:
    tail = (
        "`Trainer.fit` stopped: `max_epochs=2` reached.",
        "weights of rank 1: 0.1234567",
        "terminate called without an active exception",
    )

    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be)
        await m.begin()
        await drain(m)
        be.exit_on_stop["worker-0"] = 0
        be.exit("worker-1", -6, log_tail=tail)
        await drain(m)
        # the chief exited 0 while the master stopped it: the crash came at the end
        assert m.state is JobState.RUNNING and m.attempt == 1
        (rec,) = store.restarts_of("job-1")
        assert rec.rule == "crash-at-exit-SIGABRT"
        await m.shutdown()

    asyncio.run(scenario())


def test_the_same_crash_while_a_peer_still_runs_is_a_bare_crash(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = make(tmp_path, be, replicas=3)
        await m.begin()
        await drain(m)
        be.exit("worker-2", 0)
        await drain(m)
        be.exit("worker-1", -6, log_tail=("terminate called without an active exception",))
        await drain(m)
        (rec,) = store.restarts_of("job-1")
        assert rec.rule == "transient-signal-SIGABRT"  # worker-0 was stopped mid-run
        await m.shutdown()

    asyncio.run(scenario())
