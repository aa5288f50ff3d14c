"""queue.wait_for_capacity in the master: a capacity failure waits and retries, for free.

The same two cases twice: end to end through the CLI with real processes (slow), and on
the fake backend and clock, where the waits take zero real time and each retry is seen to
come exactly `capacity_retry_s` after the last."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from conftest import TG, child
from fakes import FakeBackend, FakeClock, make_master, pass_time, settle

from trainguard.master.loop import Master
from trainguard.records.store import Store
from trainguard.states import JobState

NO_GPU = "print:RuntimeError: No CUDA GPUs are available"


def _run(tg: TG, tmp_path: Path, actions: list[str], **queue: object) -> tuple[int, str]:
    spec = {
        "name": "flex",
        "worker_pools": [{"replicas": 1, "command": child(*actions)}],
        "fault_tolerance": {"max_capacity_restarts": 0},
        "queue": {"wait_for_capacity": True, "capacity_retry_s": 0.3, **queue},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    res = tg("run", "--quiet", "-f", str(path))
    return res.returncode, res.stderr


@pytest.mark.slow
def test_capacity_shortage_waits_then_runs_without_charging_a_budget(
    tg: TG, tmp_path: Path
) -> None:
    code, err = _run(tg, tmp_path, [f"0@0:{NO_GPU}", "0@0:exit:1", f"0@1:{NO_GPU}", "0@1:exit:1"])
    assert code == 0, err
    job = tg.only_job()
    assert job["state"] == "SUCCEEDED" and job["attempts"] == 3
    records = tg.json("records", job["id"])
    assert [r["decision"].split(":")[0] for r in records] == ["WaitForCapacity"] * 2
    assert all(r["failure_class"] == "insufficient_capacity" for r in records)
    history = tg.json("status", job["id"])
    assert history["queued_reason"] is None  # cleared once it ran


@pytest.mark.slow
def test_capacity_wait_expires_after_max_wait(tg: TG, tmp_path: Path) -> None:
    code, err = _run(
        tg, tmp_path, [NO_GPU.replace("print", "*:print", 1), "*:exit:1"], max_wait_s=1
    )
    assert code == 1
    job = tg.only_job()
    assert job["state"] == "EXPIRED" and job["error_code"] == "EXPIRED"
    assert "No CUDA GPUs" in job["error_message"]
    assert "Traceback" not in err


# ---------------------------------------------------------------- on the fake clock

NO_GPU_TAIL = ("RuntimeError: No CUDA GPUs are available",)


def _master(tmp_path: Path, clock: FakeClock, **queue: object) -> tuple[Master, Store, FakeBackend]:
    be = FakeBackend()
    m, store = make_master(
        tmp_path,
        be,
        clock,
        worker_pools=[{"replicas": 1, "command": ["x"]}],
        fault_tolerance={"max_capacity_restarts": 0},
        queue={"wait_for_capacity": True, "capacity_retry_s": 0.3, **queue},
    )
    return m, store, be


async def _no_gpu(m: Master, be: FakeBackend) -> None:
    be.exit("worker-0", 1, progressed=False, log_tail=NO_GPU_TAIL)
    await settle(m)


def test_a_shortage_waits_capacity_retry_s_then_runs_without_charging_a_budget(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        m, store, be = _master(tmp_path, clock)
        await m.begin()
        await settle(m)
        for attempt in (0, 1):  # two attempts find no GPU, each waits 0.3 s for the next
            await _no_gpu(m, be)
            assert m.state is JobState.RESTARTING and m.attempt == attempt
            assert "waiting for capacity" in str(store.job("job-1").queued_reason)
            await pass_time(m, clock, 0.29)
            assert m.attempt == attempt and len(be.launches) == attempt + 1  # still waiting
            await pass_time(m, clock, 0.01)
            running = m.state is JobState.RUNNING  # type: ignore[comparison-overlap]
            assert running and m.attempt == attempt + 1
        be.exit("worker-0", 0)
        await settle(m)
        assert m.state is JobState.SUCCEEDED
        job = store.job("job-1")
        assert job.state == "SUCCEEDED" and job.attempts == 3
        records = store.restarts_of("job-1")
        assert [(r.decision or "").split(":")[0] for r in records] == ["WaitForCapacity"] * 2
        assert all(r.failure_class == "insufficient_capacity" for r in records)
        assert m.budgets.job_restarts == 0  # for free
        assert job.queued_reason is None  # cleared once it ran
        await m.shutdown()

    asyncio.run(scenario())


def test_a_wait_expires_at_the_first_retry_past_max_wait_s(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = FakeClock()
        m, store, be = _master(tmp_path, clock, max_wait_s=1)
        await m.begin()
        await settle(m)
        t0 = clock()
        while True:
            await _no_gpu(m, be)  # every attempt finds no GPU
            if m.state.is_terminal:
                break
            await pass_time(m, clock, 0.3)
        assert m.state is JobState.EXPIRED
        # tries at 0.3, 0.6 and 0.9 s found none; the one at 1.2 s is past max_wait_s
        assert clock() - t0 == pytest.approx(1.2)
        job = store.job("job-1")
        assert job.state == "EXPIRED" and job.error_code == "EXPIRED"
        assert "No CUDA GPUs" in str(job.error_message)
        assert m.attempt == 4 and len(be.launches) == 5
        await pass_time(m, clock, 10)
        assert len(be.launches) == 5  # no retry after the expiry
        await m.shutdown()

    asyncio.run(scenario())
