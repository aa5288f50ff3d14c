"""The torchft preset at run time: each rank's environment, and the master restarting one
group alone (fake backend). Its spec and policy: test_torchft_spec.py; the real thing:
test_torchft_e2e.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBackend, FakeClock, make_master, pass_time

from trainguard.backends.interface import SERVICE_ENV
from trainguard.master.loop import Master
from trainguard.records.store import Store
from trainguard.states import JobState, ReplicaState

# ---------------------------------------------------------------- the environment


def test_each_rank_gets_its_group_its_store_and_the_lighthouse(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, _ = _master(tmp_path, be, groups=2, per=2, torchft={"quorum_retries": 7})
        await m.begin()
        by = {la.replica: la for la in be.launches}
        lighthouse, stores = by["lighthouse-0"], [by["store-0"], by["store-1"]]
        bind = lighthouse.argv[lighthouse.argv.index("--bind") + 1]
        assert lighthouse.argv[0].endswith("torchft_lighthouse")
        assert "--min_replicas" in lighthouse.argv and "--heartbeat_timeout_ms" in lighthouse.argv
        assert all(SERVICE_ENV in s.env for s in (lighthouse, *stores))
        w3 = by["worker-3"].env
        assert w3["TORCHFT_LIGHTHOUSE"] == f"http://{bind}"
        assert (w3["REPLICA_GROUP_ID"], w3["NUM_REPLICA_GROUPS"]) == ("1", "2")
        assert (w3["RANK"], w3["WORLD_SIZE"], w3["TORCHFT_QUORUM_RETRIES"]) == ("1", "2", "7")
        assert f"{w3['MASTER_ADDR']}:{w3['MASTER_PORT']}" == stores[1].argv[-1]
        assert by["worker-2"].env["MASTER_PORT"] == w3["MASTER_PORT"]
        assert by["worker-0"].env["MASTER_PORT"] != w3["MASTER_PORT"]
        assert SERVICE_ENV not in w3
        # the services were started (and listened) before any rank
        order = [la.replica for la in be.launches]
        assert order.index("store-1") < order.index("worker-0")
        await m.shutdown()

    asyncio.run(scenario())


# ---------------------------------------------------------------- the master


def _master(
    tmp_path: Path, be: FakeBackend, groups: int = 3, per: int = 1, **extra: Any
) -> tuple[Master, Store]:
    ft = {"heartbeat_timeout_ms": 200, "nproc_per_group": per, **extra.pop("torchft", {})}
    return make_master(
        tmp_path,
        be,
        FakeClock(2.0),  # when the fake backend's replicas exit: a failure happens now
        framework="torchft",
        worker_pools=[{"replicas": groups * per, "command": ["python", "t.py"]}],
        torchft=ft,
        **extra,
    )


async def _drain(m: Master, wait_s: float = 0.0) -> None:
    """Every queued event through `step`; then, for `wait_s` of the fake clock (zero real
    time), those that the timers due meanwhile set off."""
    assert isinstance(m.clock, FakeClock)
    await pass_time(m, m.clock, wait_s)


def test_a_group_is_stopped_and_restarted_alone_and_the_others_are_untouched(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = _master(tmp_path, be, groups=3, per=2)
        await m.begin()
        await _drain(m)
        assert m.state is JobState.RUNNING
        first = {la.replica: la for la in be.launches}
        be.exit("worker-3", -9)  # group 1's second rank
        await _drain(m)
        assert be.stops == [["worker-2", "store-1"]]  # the rest of group 1, nothing else
        assert m.replicas["worker-2"].state is ReplicaState.STOPPED
        assert len(be.launches) == len(first)  # not yet: the Lighthouse must drop it first
        await _drain(m, wait_s=0.19)
        assert len(be.launches) == len(first)  # the heartbeat timeout (0.2 s) is not over
        await _drain(m, wait_s=0.5)
        again = [la.replica for la in be.launches[len(first) :]]
        assert again == ["store-1", "worker-2", "worker-3"]  # its store first, fresh
        assert all(m.replicas[n].state is ReplicaState.RUNNING for n in again)
        assert [la.restart for la in be.launches[len(first) :]] == [1, 1, 1]
        (rec,) = store.restarts_of("job-1")
        assert rec.decision is not None and rec.decision.startswith("RestartGroup(group 1")
        assert "6 processes of the other groups keep training" in rec.decision
        assert rec.start_ms is not None and rec.stop_ms is not None
        assert m.state is JobState.RUNNING and m.attempt == 0
        # the other groups never saw a stop or a start
        runs = store.runs_of("job-1", attempt=0)
        assert sorted(r.replica for r in runs if r.replica in ("worker-0", "worker-4")) == [
            "worker-0",
            "worker-4",
        ]
        await m.shutdown()

    asyncio.run(scenario())


def test_every_group_down_restarts_the_job_and_a_late_group_is_not_started(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = _master(tmp_path, be, groups=2, torchft={"heartbeat_timeout_ms": 60_000})
        await m.begin()
        await _drain(m)
        be.exit("worker-1", -9)
        await _drain(m)
        assert 1 in m.job.groups_down
        be.exit("worker-0", -9)  # the last group up: nobody to heal from
        await _drain(m)
        assert m.attempt == 1 and m.state is JobState.RUNNING
        decisions = [r.decision or "" for r in store.restarts_of("job-1")]
        assert decisions[0].startswith("RestartGroup(group 1")
        assert decisions[1].startswith("RestartJob") and "no other group is up" in decisions[1]
        # in the new attempt group 1 goes down again, and group 0 finishes meanwhile
        be.exit("worker-1", -9)
        await _drain(m)
        be.exit("worker-0", 0)
        await _drain(m)
        assert m.outcome.state is JobState.SUCCEEDED
        job = store.job("job-1")
        assert job is not None and "group 1, down for a restart, is not started again" in (
            json.dumps(store.transitions_of("job-1")[-1].reason)
        )
        await m.shutdown()

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_silent_group_is_a_hung_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = _master(
            tmp_path,
            be,
            groups=2,
            fault_tolerance={"job_hang_interval_s": 0.5, "startup_timeout_s": 0.5},
        )
        await m.begin()
        await _drain(m)
        for name in ("worker-0", "worker-1"):
            m.hangs.alive(name)
        for _ in range(8):  # group 0 keeps beating, group 1 is silent
            m.inbox.on_heartbeat("worker-0", None)
            await _drain(m, wait_s=0.1)
        await _drain(m, wait_s=0.3)
        (rec,) = store.restarts_of("job-1")
        assert rec.failure_class == "hang" and rec.replica == "worker-1"
        assert (rec.decision or "").startswith("RestartGroup(group 1")
        assert "Replica group 1 hung" in (rec.error_message or "")
        await m.shutdown()

    asyncio.run(scenario())


def test_the_services_keep_their_addresses_across_a_job_restart(tmp_path: Path) -> None:
    """The backend keeps each replica's address while it runs where it did (locally:
    always), so the Lighthouse and the stores come back where the groups look for them."""

    async def scenario() -> None:
        be = FakeBackend()
        m, _ = _master(tmp_path, be, groups=1)
        await m.begin()
        await _drain(m)
        before = dict(m.launches.tasks)
        be.exit("worker-0", -9)  # the only group: no peer, the job restarts
        await _drain(m)
        assert m.attempt == 1 and dict(m.launches.tasks) == before
        stores = [la.argv[-1] for la in be.launches if la.replica == "store-0"]
        assert len(stores) == 2 and stores[0] == stores[1]
        await m.shutdown()

    asyncio.run(scenario())
