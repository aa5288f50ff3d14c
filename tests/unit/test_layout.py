"""Table tests for the replica layout: names, ranks, and each replica's environment."""

from __future__ import annotations

import pytest

from trainguard.frameworks import EnvContext, Roster, preset
from trainguard.frameworks.replica_plan import plan_replicas, primary_replica, replica_env
from trainguard.spec.models import (
    JobSpec,
    validate_spec,
)

POOL = {"command": ["python", "train.py"]}


# ---------------------------------------------------------------- layout


def _pools_spec() -> JobSpec:
    # The chief pool is listed last on purpose: it still comes first.
    return validate_spec(
        {
            "name": "job",
            "worker_pools": [
                {"role": "worker", "replicas": 2, "command": ["python", "w.py"], "env": {"W": "1"}},
                {"role": "chief", "command": ["python", "c.py"]},
                {"role": "evaluator", "command": ["python", "e.py"]},
            ],
        }
    )


def test_plan_replicas_chief_first() -> None:
    plans = plan_replicas(_pools_spec())
    assert [(p.name, p.role, p.index, p.rank) for p in plans] == [
        ("chief-0", "chief", 0, 0),
        ("worker-0", "worker", 0, 1),
        ("worker-1", "worker", 1, 2),
        ("evaluator-0", "evaluator", 0, 3),
    ]
    assert plans[0].argv == ("python", "c.py")
    assert plans[1].argv == ("python", "w.py")
    assert plans[1].env == (("W", "1"),)
    assert plans[0].env == ()
    assert primary_replica(plans) == "chief-0"


def test_plan_replicas_workers_only() -> None:
    spec = validate_spec(
        {"name": "x", "worker_pools": [{"replicas": 3, "command": ["python", "x.py"]}]}
    )
    plans = plan_replicas(spec)
    assert [p.name for p in plans] == ["worker-0", "worker-1", "worker-2"]
    assert [p.rank for p in plans] == [0, 1, 2]
    assert primary_replica(plans) == "worker-0"


def test_replica_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plans = plan_replicas(_pools_spec())
    ctx = EnvContext(plans[2], Roster(tuple(plans)), "job-abc", "127.0.0.1", 29500, 2, 3)
    env = replica_env(preset("pytorch"), ctx, {"TRAINGUARD_SDK": "on"})
    expected = {
        "RANK": "2",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "worker",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "job-abc",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",  # as torchrun, with more than one process
        "TRAINGUARD_JOB_ID": "job-abc",
        "TRAINGUARD_REPLICA": "worker-1",
        "TRAINGUARD_RESTART_COUNT": "2",
        "PYTHONUNBUFFERED": "1",
        "TRAINGUARD_SDK": "on",
        "W": "1",
    }
    assert env == expected


def test_omp_threads_are_the_users_where_set_and_not_set_for_one_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plans = plan_replicas(_pools_spec())
    ctx = EnvContext(plans[2], Roster(tuple(plans)), "job-abc", "127.0.0.1", 29500, 2, 3)
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert preset("pytorch").env(ctx)["OMP_NUM_THREADS"] == "4"
    (one,) = plans[:1]
    alone = EnvContext(one, Roster((one,)), "job-abc", "127.0.0.1", 29500, 0, 3)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert "OMP_NUM_THREADS" not in preset("pytorch").env(alone)


def test_replica_env_user_env_wins() -> None:
    spec = validate_spec(
        {
            "name": "job",
            "worker_pools": [
                {
                    "command": ["x"],
                    "env": {"MASTER_PORT": "1234", "PYTHONUNBUFFERED": "0", "SDK": "user"},
                }
            ],
        }
    )
    (plan,) = plan_replicas(spec)
    ctx = EnvContext(plan, Roster((plan,)), "j", "localhost", 29500, 0, "unlimited")
    env = replica_env(preset("pytorch"), ctx, {"SDK": "sdk", "MASTER_ADDR": "10.0.0.1"})
    assert env["MASTER_PORT"] == "1234"  # the user's env beats ours
    assert env["PYTHONUNBUFFERED"] == "0"
    assert env["SDK"] == "user"  # and the SDK's
    assert env["MASTER_ADDR"] == "10.0.0.1"  # the SDK's env beats ours
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "unlimited"
    assert env["RANK"] == "0"
    assert env["TRAINGUARD_REPLICA"] == "worker-0"
