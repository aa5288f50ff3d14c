"""The torchft preset's logic: its spec, its environment, the group policy, and the
master restarting one group alone (fake backend). The real thing: test_torchft_e2e.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeBackend, make_master

from trainguard.backends.api import SERVICE_ENV
from trainguard.cli.parser import build_parser
from trainguard.cli.spec_flags import build_spec, split_command
from trainguard.errors import SpecError
from trainguard.frameworks import preset
from trainguard.master.loop import Master
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.classes import Classification, ExitKind, FailureClass
from trainguard.policy.decisions import (
    FailJob,
    RestartGroup,
    RestartJob,
    RestartReplica,
    decide_failure,
    describe,
)
from trainguard.records.store import Store
from trainguard.spec.models import JobSpec, validate_spec
from trainguard.states import JobState, ReplicaState


def _spec(groups: int = 3, per: int = 1, **extra: Any) -> JobSpec:
    return validate_spec(
        {
            "name": "ft",
            "framework": "torchft",
            "worker_pools": [{"replicas": groups * per, "command": ["python", "t.py"]}],
            "torchft": {"nproc_per_group": per, **extra.pop("torchft", {})},
            **extra,
        }
    )


# ---------------------------------------------------------------- the spec


def test_a_torchft_spec_gets_its_lighthouse_and_one_store_per_group() -> None:
    spec = _spec(groups=3, per=2)
    pools = {p.role: p for p in spec.worker_pools}
    assert [p.role for p in spec.worker_pools] == ["worker", "lighthouse", "store"]
    assert pools["lighthouse"].command[0].endswith("torchft_lighthouse")
    assert pools["store"].replicas == 3
    assert pools["store"].command[-2:] == ["-m", "trainguard.frameworks.torchft_store"]
    assert spec.fault_tolerance.execution_mode.value == "async"
    assert spec.success_policy.value == "all"
    # what the spec says is kept: a lighthouse of the user's own
    own = validate_spec(
        {
            "name": "ft",
            "framework": "torchft",
            "worker_pools": [
                {"replicas": 2, "command": ["python", "t.py"]},
                {"role": "lighthouse", "command": ["/opt/torchft_lighthouse"]},
            ],
        }
    )
    assert [p.command for p in own.worker_pools if p.role == "lighthouse"] == [
        ["/opt/torchft_lighthouse"]
    ]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {
                "worker_pools": [{"replicas": 3, "command": ["x"]}],
                "torchft": {"nproc_per_group": 2},
            },
            "not whole groups of torchft.nproc_per_group 2",
        ),
        ({"torchft": {"min_replicas": 4}}, "torchft.min_replicas: 4 groups for a quorum"),
        ({"fault_tolerance": {"execution_mode": "sync"}}, "a torchft job is async"),
        ({"worker_pools": [{"role": "chief", "command": ["x"]}]}, "has no role 'chief'"),
        ({"torchft": {"heartbeat_timeout_ms": 5}}, "torchft.heartbeat_timeout_ms"),
        (
            {
                "worker_pools": [
                    {"replicas": 2, "command": ["x"]},
                    {"role": "store", "replicas": 1, "command": ["x"]},
                ]
            },
            "one store per group (2), got 1",
        ),
    ],
)
def test_a_torchft_spec_that_cannot_work_names_why(change: dict[str, Any], problem: str) -> None:
    data: dict[str, Any] = {
        "name": "ft",
        "framework": "torchft",
        "worker_pools": [{"replicas": 3, "command": ["python", "t.py"]}],
        **change,
    }
    with pytest.raises(SpecError) as info:
        validate_spec(data)
    assert problem in "\n".join(info.value.problems)


def _build(*argv: str) -> JobSpec:
    head, command = split_command(["run", *argv])
    return build_spec(build_parser().parse_args(head), command)


def test_the_cli_builds_groups_of_ranks() -> None:
    spec = _build(
        "--framework", "torchft", "--groups", "3", "--nproc-per-group", "2", "--", "python", "t.py"
    )
    assert {p.role: p.replicas for p in spec.worker_pools} == {
        "worker": 6,
        "lighthouse": 1,
        "store": 3,
    }
    assert spec.torchft.nproc_per_group == 2
    assert _build("--framework", "torchft", "--nproc-per-node", "2", "--", "x").world_size == 5


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--groups", "2", "--", "x"), "--groups: applies to --framework torchft only"),
        (("--framework", "torchft", "--groups", "two", "--", "x"), "--groups: must be a whole"),
        (("--framework", "torchft", "--groups", "0", "--", "x"), "--groups: must be 1 to"),
        (
            ("--framework", "torchft", "--groups", "2", "--nproc-per-node", "2", "--", "x"),
            "give one of them",
        ),
    ],
)
def test_the_cli_refuses_group_flags_that_make_no_sense(
    argv: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(SpecError) as info:
        _build(*argv)
    assert problem in "\n".join(info.value.problems)


# ---------------------------------------------------------------- the policy


def _failure(
    replica: str,
    cls: FailureClass = FailureClass.PREEMPTION,
    retryable: bool = True,
    restart: int = 0,
    step: int | None = None,
) -> Failure:
    c = Classification(
        ExitKind.SIGNAL,
        cls,
        retryable,
        "rule-x",
        -9,
        None,
        "why",
        "message",
        fingerprint=f"fp-{cls.value}",
        confidence=0.9,
    )
    role = replica.rsplit("-", 1)[0]
    return Failure(replica, role, 0, 0, 1, 0.0, c, restart=restart, progress=step)


def test_a_failed_rank_restarts_its_whole_group_alone_within_its_budget() -> None:
    spec = _spec(groups=3, per=2, torchft={"max_group_restarts": 2, "heartbeat_timeout_ms": 1500})
    roles = preset("torchft").role_policy(spec)
    assert roles.groups[1] == ("worker-2", "worker-3", "store-1")
    b = Budgets()
    for n in (1, 2):
        failure = _failure("worker-3", step=10 * n)
        d = decide_failure(spec.fault_tolerance, b, failure, 9, roles=roles, groups_up=2)
        assert isinstance(d, RestartGroup), d
        assert (d.group, d.replicas, d.after_s) == (1, roles.groups[1], 1.5)
        assert "6 processes of the other groups keep training" in d.reason
        assert f"group_restarts:group-1 {n}/2" in describe(d)
        b = b.after(failure, d)
    spent = decide_failure(
        spec.fault_tolerance, b, _failure("worker-2", step=99), 9, roles=roles, groups_up=2
    )
    assert isinstance(spent, RestartJob) and "group 1 spent its 2 restarts" in spent.reason
    # a job restart gives every group its restarts back
    b = b.after(_failure("worker-2", step=99), spent)
    again = decide_failure(
        spec.fault_tolerance, b, _failure("worker-0", step=5), 9, roles=roles, groups_up=2
    )
    assert isinstance(again, RestartGroup) and "group_restarts:group-0 1/2" in describe(again)


def test_with_no_group_up_to_heal_from_the_job_restarts() -> None:
    spec = _spec(groups=2)
    roles = preset("torchft").role_policy(spec)
    d = decide_failure(spec.fault_tolerance, Budgets(), _failure("worker-0"), 4, roles=roles)
    assert isinstance(d, RestartJob) and "no other group is up to heal from" in d.reason


def test_a_bug_in_a_group_fails_the_job_and_a_repeated_crash_is_not_retried_forever() -> None:
    spec = _spec(groups=2, fault_tolerance={"max_num_of_same_error": 2})
    roles = preset("torchft").role_policy(spec)
    ft = spec.fault_tolerance
    bug = _failure("worker-1", FailureClass.USER_ERROR, retryable=False)
    assert isinstance(decide_failure(ft, Budgets(), bug, 4, roles=roles, groups_up=1), FailJob)
    b, decisions = Budgets(), []
    for step in range(5):  # the same crash, at a new step each time (the group healed on)
        f = _failure("worker-1", FailureClass.TRANSIENT_EXIT, step=step * 7, restart=step)
        d = decide_failure(ft, b, f, 4, roles=roles, groups_up=1)
        decisions.append(d)
        if isinstance(d, FailJob):
            break
        b = b.after(f, d)
    assert isinstance(decisions[-1], FailJob) and len(decisions) <= 3


def test_the_lighthouse_restarts_alone() -> None:
    spec = _spec(groups=2)
    roles = preset("torchft").role_policy(spec)
    f = _failure("lighthouse-0")
    d = decide_failure(spec.fault_tolerance, Budgets(), f, 4, roles=roles, groups_up=2)
    assert isinstance(d, RestartReplica) and d.replica == "lighthouse-0"


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
        framework="torchft",
        worker_pools=[{"replicas": groups * per, "command": ["python", "t.py"]}],
        torchft=ft,
        **extra,
    )


async def _drain(m: Master, wait_s: float = 0.0) -> None:
    """Every queued event through `step`; then, for `wait_s`, those that come later."""
    loop = asyncio.get_running_loop()
    end = loop.time() + wait_s
    while True:
        while not m._queue.empty():
            await m.step(m._queue.get_nowait())
        if loop.time() >= end:
            return
        await asyncio.sleep(0.02)


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
        assert 1 in m._groups_down
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


def test_a_silent_group_is_a_hung_group(tmp_path: Path) -> None:
    async def scenario() -> None:
        be = FakeBackend()
        m, store = _master(
            tmp_path,
            be,
            groups=2,
            fault_tolerance={"job_hang_interval": 0.5, "startup_timeout_s": 0.5},
        )
        watch = asyncio.create_task(m.hangs.run())
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
        watch.cancel()
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
