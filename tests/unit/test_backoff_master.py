"""The master waits out an outage's backoff (issue 38): against a fake backend, no process.

The policy puts the wait in the decision (`delay_s`); the master stops the attempt, starts
the next one only when the wait is over, and a cancel during the wait ends the job at once.
The waits pass on the fake clock, in zero real time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fakes import FakeBackend, FakeClock, pass_time
from policy_cases import HTTP_503
from test_master import drain as _drain
from test_master import make

from trainguard.master.loop import Master
from trainguard.records.store import Store
from trainguard.states import JobState

WAIT_S = 0.3  # the backoff's first step in these specs: short, but a timer all the same


def _make(tmp_path: Path, be: FakeBackend, **ft: object) -> tuple[Master, Store]:
    return make(tmp_path, be, 2, **{"transient_backoff_s": WAIT_S, **ft})


def _clock(m: Master) -> FakeClock:
    """The master's clock, which is its timers too (`fakes.make_master`)."""
    assert isinstance(m.clock, FakeClock)
    return m.clock


async def _fail_with_503(m: Master, be: FakeBackend) -> None:
    be.exit("worker-1", 1, progressed=False, log_tail=HTTP_503)
    await _drain(m)


def test_the_next_attempt_starts_only_when_the_backoff_is_over(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = _make(tmp_path, be)
        await m.begin()
        await _drain(m)
        await _fail_with_503(m, be)
        assert m.state is JobState.RESTARTING and m.attempt == 0
        launched = len(be.launches)
        await pass_time(m, _clock(m), WAIT_S * 0.99)
        assert len(be.launches) == launched and m.attempt == 0  # still waiting
        await pass_time(m, _clock(m), WAIT_S * 0.01)
        assert m.state is JobState.RUNNING and m.attempt == 1  # type: ignore[comparison-overlap]
        assert len(be.launches) == launched + 2
        (rec,) = store.restarts_of("job-1")
        assert rec.schedule_ms == WAIT_S * 1000
        assert "a remote service outage: retried in 0.3 s (backoff 1 of " in (rec.decision or "")
        await m.shutdown()

    asyncio.run(scenario())


def test_a_cancel_during_the_backoff_ends_the_job_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = _make(tmp_path, be, transient_backoff_s=30, transient_backoff_max_s=60)
        await m.begin()
        await _drain(m)
        await _fail_with_503(m, be)
        assert m.state is JobState.RESTARTING
        launched = len(be.launches)
        m.cancel()
        await _drain(m)
        assert m.state is JobState.CANCELLED  # type: ignore[comparison-overlap]
        assert len(be.launches) == launched
        await m.shutdown()

    asyncio.run(scenario())


def test_a_timer_of_a_cancelled_wait_starts_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = _make(tmp_path, be)
        await m.begin()
        await _drain(m)
        await _fail_with_503(m, be)
        launched = len(be.launches)
        m.cancel()
        await _drain(m)
        await pass_time(m, _clock(m), WAIT_S * 2)
        assert m.state is JobState.CANCELLED and len(be.launches) == launched
        await m.shutdown()

    asyncio.run(scenario())


def test_a_replica_restarted_alone_waits_while_the_others_train_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = _make(tmp_path, be, execution_mode="async")
        await m.begin()
        await _drain(m)
        await _fail_with_503(m, be)
        assert m.state is JobState.RUNNING and "worker-0" in be.live
        assert "worker-1" not in be.live
        await pass_time(m, _clock(m), WAIT_S * 0.99)
        assert "worker-1" not in be.live  # its backoff is not over
        await pass_time(m, _clock(m), WAIT_S * 1.01)
        assert "worker-1" in be.live and be.live["worker-1"].restart == 1
        (rec,) = store.restarts_of("job-1")
        assert rec.schedule_ms is not None and 0 < rec.schedule_ms <= WAIT_S * 1000
        await m.shutdown()

    asyncio.run(scenario())


def test_a_replica_waiting_alone_is_not_started_after_a_cancel(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = _make(tmp_path, be, execution_mode="async")
        await m.begin()
        await _drain(m)
        await _fail_with_503(m, be)
        m.cancel()
        await _drain(m)
        assert m.state is JobState.CANCELLED
        await pass_time(m, _clock(m), WAIT_S * 2)
        assert "worker-1" not in be.live
        await m.shutdown()

    asyncio.run(scenario())
