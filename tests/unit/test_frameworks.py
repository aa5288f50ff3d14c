"""Framework presets (R-JOB-7): the environment each gives, their spec rules and roles."""

from __future__ import annotations

import json
from typing import Any

import pytest
from policy_cases import _failure

from trainguard.errors import SpecError
from trainguard.frameworks import PRESETS, EnvContext, Roster, preset
from trainguard.frameworks.replica_plan import plan_replicas, replica_env
from trainguard.policy.actions import FailJob, GiveUpReplica, RestartJob, RestartReplica
from trainguard.policy.budgets import Budgets
from trainguard.policy.decisions import decide_failure
from trainguard.spec.models import ExecutionMode, SuccessPolicy, validate_spec


def _spec(framework: str, pools: list[dict[str, Any]], **extra: Any) -> Any:
    return validate_spec({"name": "j", "framework": framework, "worker_pools": pools, **extra})


class _CountedPlans(tuple):  # type: ignore[type-arg]
    """The job's plans, counting how often a preset walks all of them."""

    walks = 0

    def __iter__(self) -> Any:
        _CountedPlans.walks += 1
        return super().__iter__()


def _envs(spec: Any) -> dict[str, dict[str, str]]:
    plans = _CountedPlans(plan_replicas(spec))
    addresses = {p.name: f"127.0.0.1:{7000 + p.rank}" for p in plans}
    roster = Roster(plans, addresses)
    out = {}
    for plan in plans:
        ctx = EnvContext(plan, roster, "job-1", "127.0.0.1", 29500, 0, 3)
        out[plan.name] = replica_env(preset(spec.framework), ctx)
    return out


@pytest.mark.parametrize("framework", sorted(PRESETS))
def test_building_every_replicas_environment_is_linear(framework: str) -> None:
    """Each preset walks the job's replicas a fixed number of times, not once per replica."""
    roles = {"tensorflow": "worker", "mpi": "launcher"}
    pools = [{"role": roles.get(framework, "worker"), "replicas": 300, "command": ["x"]}]
    if framework == "mpi":
        pools = [
            {"role": "launcher", "command": ["x"]},
            {"role": "worker", "replicas": 299, "command": ["x"]},
        ]
    _CountedPlans.walks = 0
    spec = _spec(framework, pools)
    envs = _envs(spec)
    assert len(envs) == spec.world_size >= 300  # torchft: a store per group, a lighthouse
    assert _CountedPlans.walks <= 4, _CountedPlans.walks  # the test's own two, and the preset's


TF_POOLS: list[dict[str, Any]] = [
    {"role": "worker", "replicas": 2, "command": ["w"]},
    {"role": "ps", "command": ["p"]},
    {"role": "chief", "command": ["c"]},
    {"role": "evaluator", "command": ["e"]},
]


def test_tensorflow_tasks_get_tf_config_and_vertex_cluster_spec() -> None:
    envs = _envs(_spec("tensorflow", TF_POOLS))
    cluster = {
        "chief": ["127.0.0.1:7000"],
        "worker": ["127.0.0.1:7001", "127.0.0.1:7002"],
        "ps": ["127.0.0.1:7003"],
    }
    for name, (kind, index) in {
        "chief-0": ("chief", 0),
        "worker-1": ("worker", 1),
        "ps-0": ("ps", 0),
        "evaluator-0": ("evaluator", 0),
    }.items():
        tf = json.loads(envs[name]["TF_CONFIG"])
        assert tf == {"cluster": cluster, "task": {"type": kind, "index": index}}
    vertex = json.loads(envs["worker-1"]["CLUSTER_SPEC"])
    assert vertex["cluster"]["workerpool1"] == cluster["worker"]
    assert vertex["cluster"]["workerpool3"] == ["127.0.0.1:7004"]
    assert vertex["task"] == {"type": "workerpool1", "index": 1}
    assert "MASTER_PORT" not in envs["chief-0"] and envs["chief-0"]["RANK"] == "0"


def test_batch_shards_get_their_index_and_count() -> None:
    envs = _envs(_spec("batch", [{"role": "shard", "replicas": 3, "command": ["s"]}]))
    assert [(e["SHARD_INDEX"], e["SHARD_COUNT"]) for e in envs.values()] == [
        ("0", "3"),
        ("1", "3"),
        ("2", "3"),
    ]


def test_generic_gives_rank_and_world_size_only() -> None:
    env = _envs(_spec("generic", [{"replicas": 2, "command": ["x"]}]))["worker-1"]
    framework = {k for k in env if not k.startswith("TRAINGUARD_") and k != "PYTHONUNBUFFERED"}
    assert framework == {"RANK", "WORLD_SIZE"}


def test_pytorch_is_the_default_and_gives_the_torchrun_environment() -> None:
    spec = validate_spec({"name": "j", "worker_pools": [{"replicas": 2, "command": ["x"]}]})
    env = _envs(spec)["worker-1"]
    assert spec.framework == "pytorch"
    assert env["MASTER_PORT"] == "29500" and env["TORCHELASTIC_RESTART_COUNT"] == "0"


@pytest.mark.parametrize(
    ("framework", "mode", "success"),
    [
        ("pytorch", ExecutionMode.SYNC, SuccessPolicy.CHIEF),
        ("tensorflow", ExecutionMode.SYNC, SuccessPolicy.CHIEF),  # no ps: MWMS
        ("batch", ExecutionMode.ASYNC, SuccessPolicy.ALL),
        ("generic", ExecutionMode.SYNC, SuccessPolicy.CHIEF),
    ],
)
def test_each_preset_has_its_defaults_and_the_spec_overrides_them(
    framework: str, mode: ExecutionMode, success: SuccessPolicy
) -> None:
    pools = [{"role": "chief" if framework == "tensorflow" else "worker", "command": ["x"]}]
    spec = _spec(framework, pools)
    assert (spec.fault_tolerance.execution_mode, spec.success_policy) == (mode, success)
    spec = _spec(framework, pools, fault_tolerance={"execution_mode": "sync"})
    assert spec.fault_tolerance.execution_mode is ExecutionMode.SYNC


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            {"framework": "tensorflow", "worker_pools": [{"role": "trainer", "command": ["x"]}]},
            "framework tensorflow has no role 'trainer' (its roles: chief, evaluator, ps, worker)",
        ),
        (
            {"framework": "tensorflow", "worker_pools": [{"role": "ps", "command": ["x"]}]},
            "a tensorflow job needs a chief or a worker pool",
        ),
        (
            {"framework": "tensorflow", "backend": "ray", "worker_pools": [{"command": ["x"]}]},
            "framework tensorflow runs on the local backend only for now",
        ),
        (
            {"allow_partial": True, "worker_pools": [{"command": ["x"]}]},
            "allow_partial: a pytorch job cannot succeed in part",
        ),
    ],
)
def test_a_job_that_does_not_fit_its_framework_is_refused(
    data: dict[str, Any], problem: str
) -> None:
    with pytest.raises(SpecError) as exc:
        validate_spec({"name": "j", **data})
    assert any(problem in line for line in exc.value.problems)


def test_every_preset_is_in_the_table_under_its_own_name() -> None:
    assert all(name == p.name for name, p in PRESETS.items())


def test_tensorflow_with_parameter_servers_is_async() -> None:
    spec = _spec("tensorflow", TF_POOLS)
    assert spec.fault_tolerance.execution_mode is ExecutionMode.ASYNC


def _decide(framework: str, role: str, kind: str, **extra: Any) -> Any:
    pools: list[dict[str, Any]] = [
        {"role": r, "command": ["x"]} for r in ("chief", "worker", "ps", "evaluator")
    ]
    if framework == "batch":
        pools = [{"role": "shard", "replicas": 2, "command": ["x"]}]
    spec = _spec(framework, pools, **extra)
    failure = _failure(kind, f"{role}-0", role)
    spent = Budgets(replica_restarts={f"{role}-0": 5})
    roles = preset(framework).role_policy(spec)
    first = decide_failure(spec.fault_tolerance, Budgets(), failure, 4, roles=roles)
    last = decide_failure(spec.fault_tolerance, spent, failure, 4, roles=roles)
    return first, last


def test_tensorflow_async_rules_by_role() -> None:
    first, last = _decide("tensorflow", "worker", "transient")
    assert isinstance(first, RestartReplica) and isinstance(last, RestartJob)
    first, _ = _decide("tensorflow", "ps", "transient")
    assert isinstance(first, RestartJob)
    first, _ = _decide(
        "tensorflow", "chief", "transient", fault_tolerance={"enable_job_restart": False}
    )
    assert isinstance(first, FailJob)
    first, last = _decide("tensorflow", "evaluator", "transient")
    assert isinstance(first, RestartReplica) and isinstance(last, GiveUpReplica)
    bug, _ = _decide("tensorflow", "evaluator", "user")  # even a bug: training goes on
    assert isinstance(bug, GiveUpReplica) and "evaluator is optional" in bug.reason


@pytest.mark.parametrize("partial", [False, True])
def test_batch_shard_that_spends_its_restarts(partial: bool) -> None:
    first, last = _decide("batch", "shard", "transient", allow_partial=partial)
    assert isinstance(first, RestartReplica)
    assert isinstance(last, GiveUpReplica if partial else FailJob)
    assert "shard-0 spent its 5 restarts" in last.reason
