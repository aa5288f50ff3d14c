"""Each rank's environment from where the ranks landed (issue 37), without a cluster: the
variables torchrun gives a layout, each node's GPUs, and Slurm's task variables, for even
and uneven layouts, ranks spread round-robin (Ray's SPREAD), torchft's groups, and a rank
restarted alone. tests/e2e/test_node_env_e2e.py compares them with real torchrun and srun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.backends.interface import Launch
from trainguard.backends.ray.host import NODE_DEVICES_ENV
from trainguard.backends.ray.placement import Placement
from trainguard.backends.ray.warm import NodeZygotes
from trainguard.backends.slurm.placement import layout_env, place, srun_argv
from trainguard.frameworks import EnvContext, Roster, preset
from trainguard.frameworks.node_env import hostlist, placed_envs, tasks_per_node
from trainguard.frameworks.replica_plan import plan_replicas, replica_env
from trainguard.spec.engines import RayOptions
from trainguard.spec.models import validate_spec

NODE_VARS = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK")


def _envs(replicas: int, framework: str = "pytorch", **extra: Any) -> dict[str, dict[str, str]]:
    """Each replica's environment as the preset builds it (before any placement)."""
    spec = validate_spec(
        {
            "name": "x",
            "framework": framework,
            "worker_pools": [{"replicas": replicas, "command": ["python", "t.py"]}],
            **extra,
        }
    )
    plans = plan_replicas(spec)
    roster = Roster(tuple(plans), {p.name: f"10.0.0.1:{7000 + p.rank}" for p in plans}, spec)
    p = preset(framework)
    out = {}
    for plan in plans:
        ctx = EnvContext(plan, roster, "job-1", "10.0.0.1", 29500, 0, 3)
        out[plan.name] = replica_env(p, ctx)
    return out


def _torchrun(per_node: list[int]) -> list[dict[str, str]]:
    """What torchrun gives rank r of nodes holding `per_node` ranks each, in rank order
    (`--node-rank` k, `--nproc-per-node` per_node[k]): its ranks are node k's, in order."""
    out = []
    for k, n in enumerate(per_node):
        for local in range(n):
            out.append(
                {
                    "RANK": str(sum(per_node[:k]) + local),
                    "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(n),
                    "GROUP_RANK": str(k),
                    "GROUP_WORLD_SIZE": str(len(per_node)),
                    "NODE_RANK": str(k),
                    "WORLD_SIZE": str(sum(per_node)),
                }
            )
    return out


def _applied(envs: dict[str, dict[str, str]], nodes: dict[str, str]) -> dict[str, dict[str, str]]:
    ranks = {r: (int(env["RANK"]), env) for r, env in envs.items()}
    changes = placed_envs(ranks, nodes)
    return {r: {**envs[r], **changes[r]} for r in envs}


@pytest.mark.parametrize(
    "per_node", [[2, 2, 2], [1], [4], [3, 2, 1], [1, 3], [2, 2, 2, 1], [1, 1, 1, 1, 1]]
)
def test_ranks_that_fill_nodes_in_order_get_what_torchrun_gives(per_node: list[int]) -> None:
    world = sum(per_node)
    envs = _envs(world)
    nodes = {f"worker-{i}": f"n{k}" for i, k in enumerate(_node_of_each(per_node))}
    got = _applied(envs, nodes)
    for want in _torchrun(per_node):
        env = got[f"worker-{want['RANK']}"]
        assert {k: env[k] for k in want} == want
        assert env["ROLE_RANK"] == want["RANK"] and env["ROLE_WORLD_SIZE"] == str(world)


def _node_of_each(per_node: list[int]) -> list[int]:
    return [k for k, n in enumerate(per_node) for _ in range(n)]


def test_ranks_spread_round_robin_number_nodes_by_their_lowest_rank() -> None:
    """Ray's SPREAD puts rank i on node i % 3: a node's ranks are not consecutive."""
    envs = _envs(6)
    nodes = {f"worker-{i}": ["b", "c", "a"][i % 3] for i in range(6)}
    got = _applied(envs, nodes)
    assert [
        (got[f"worker-{i}"]["GROUP_RANK"], got[f"worker-{i}"]["LOCAL_RANK"]) for i in range(6)
    ] == [
        ("0", "0"),
        ("1", "0"),
        ("2", "0"),
        ("0", "1"),
        ("1", "1"),
        ("2", "1"),
    ]
    assert {got[f"worker-{i}"]["LOCAL_WORLD_SIZE"] for i in range(6)} == {"2"}
    assert {got[f"worker-{i}"]["GROUP_WORLD_SIZE"] for i in range(6)} == {"3"}


def test_one_node_keeps_what_the_preset_gave() -> None:
    envs = _envs(3)
    got = _applied(envs, {r: "only" for r in envs})
    for r, env in got.items():
        assert {k: env[k] for k in NODE_VARS} == {
            "LOCAL_RANK": envs[r]["RANK"],
            "LOCAL_WORLD_SIZE": "3",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
            "NODE_RANK": "0",
        }


def test_a_preset_without_node_variables_gets_none() -> None:
    envs = _envs(4, framework="generic")
    got = _applied(envs, {r: f"n{i // 2}" for i, r in enumerate(envs)})
    assert got == envs


def test_torchft_ranks_are_local_within_their_group_on_their_node() -> None:
    """Two groups of 2 over 2 nodes, one rank of each group per node: each rank is the
    only one of its group on its node."""
    extra = {"torchft": {"nproc_per_group": 2}}
    spec = {"worker_pools": [{"replicas": 4, "command": ["python", "t.py"]}]}
    envs = {
        r: e
        for r, e in _envs_torchft(spec, extra).items()
        if r.startswith("worker-")  # the services keep theirs
    }
    nodes = {"worker-0": "n0", "worker-1": "n1", "worker-2": "n0", "worker-3": "n1"}
    ranks = {r: (int(r.split("-")[1]), env) for r, env in envs.items()}
    changes = placed_envs(ranks, nodes)
    for r in envs:
        assert changes[r] == {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, r
    same_node = {r: "n0" for r in envs}
    changes = placed_envs(ranks, same_node)
    assert [changes[f"worker-{i}"]["LOCAL_RANK"] for i in range(4)] == ["0", "1", "0", "1"]


def _envs_torchft(spec: dict[str, Any], extra: dict[str, Any]) -> dict[str, dict[str, str]]:
    full = validate_spec({"name": "x", "framework": "torchft", **spec, **extra})
    plans = plan_replicas(full)
    roster = Roster(tuple(plans), {p.name: f"10.0.0.1:{7000 + p.rank}" for p in plans}, full)
    out = {}
    for plan in plans:
        ctx = EnvContext(plan, roster, "job-1", "10.0.0.1", 29500, 0, 3)
        out[plan.name] = replica_env(preset("torchft"), ctx)
    return out


def test_gpus_handed_out_on_one_machine_are_laid_out_node_by_node() -> None:
    """The master hands out ids 0-5 from one machine's list; on 3 nodes of 2 ranks each
    node's ranks hold ids 0 and 1, and both see both, so cuda:LOCAL_RANK is their own."""
    envs = _envs(6)
    for i, r in enumerate(envs):
        envs[r]["CUDA_VISIBLE_DEVICES"] = str(i)
    got = _applied(envs, {f"worker-{i}": f"n{i // 2}" for i in range(6)})
    for i in range(6):
        env = got[f"worker-{i}"]
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[int(env["LOCAL_RANK"])] == str(i % 2)
    uneven = _applied(envs, {f"worker-{i}": "n0" if i < 4 else "n1" for i in range(6)})
    assert uneven["worker-3"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert uneven["worker-5"]["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_two_gpus_a_rank_and_an_inherited_list_left_alone() -> None:
    envs = _envs(4)
    for i, r in enumerate(envs):
        envs[r]["CUDA_VISIBLE_DEVICES"] = f"{2 * i},{2 * i + 1}"
    got = _applied(envs, {f"worker-{i}": f"n{i // 2}" for i in range(4)})
    assert got["worker-3"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    for env in envs.values():
        env["CUDA_VISIBLE_DEVICES"] = "0,1"  # the master's own, inherited by all
    got = _applied(envs, {f"worker-{i}": f"n{i // 2}" for i in range(4)})
    assert {e["CUDA_VISIBLE_DEVICES"] for e in got.values()} == {"0,1"}


def _launches(envs: dict[str, dict[str, str]], tmp: Path, attempt: int = 0) -> list[Launch]:
    return [
        Launch(attempt, r, int(env["RANK"]), 0, ("python", "t.py"), env, "/w", tmp / r)
        for r, env in envs.items()
    ]


def test_slurm_task_variables_say_what_one_srun_of_the_layout_would(tmp_path: Path) -> None:
    envs = _envs(5)
    launches = {la.replica: la for la in _launches(envs, tmp_path)}
    placed = place([(la.replica, la.rank) for la in launches.values()], ["h-0", "h-1", "h-2"], 2)
    assert isinstance(placed, dict)
    layout = layout_env(launches, placed)
    env, task = layout["worker-3"]
    assert env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1"
    assert task == {
        "SLURM_NTASKS": "5",
        "SLURM_NPROCS": "5",
        "SLURM_STEP_NUM_TASKS": "5",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NNODES": "3",
        "SLURM_STEP_NUM_NODES": "3",
        "SLURM_GTIDS": "2,3",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
        "SLURM_NODELIST": "h-[0-2]",
        "SLURM_STEP_NODELIST": "h-[0-2]",
    }
    argv = srun_argv(launches["worker-3"], "h-1", "42", task_env=task)
    cut = argv.index("env")
    assert argv[cut + 1] == "--" and "SLURM_NTASKS=5" in argv[cut:]
    assert argv[-2:] == ["python", "t.py"]
    assert "env" not in srun_argv(launches["worker-3"], "h-1", "42")


def test_a_rank_restarted_alone_keeps_its_place_in_the_layout(tmp_path: Path) -> None:
    envs = _envs(4)
    launches = {la.replica: la for la in _launches(envs, tmp_path)}
    nodes = {f"worker-{i}": f"h{i // 2}" for i in range(4)}
    first = layout_env(launches, nodes)
    again = layout_env({"worker-3": launches["worker-3"], **launches}, nodes)
    assert again["worker-3"] == first["worker-3"]
    assert first["worker-3"][1]["SLURM_NTASKS"] == "4"


def test_hostlist_and_tasks_per_node_as_slurm_writes_them() -> None:
    assert hostlist(["tg-host-2", "tg-host-0", "tg-host-1"]) == "tg-host-[0-2]"
    assert hostlist(["n1", "n3", "n4", "n10"]) == "n[1,3-4,10]"
    assert hostlist(["n01", "n02"]) == "n[01-02]"
    assert hostlist(["login", "a7"]) == "a7,login"
    assert tasks_per_node([2, 2, 2]) == "2(x3)"
    assert tasks_per_node([3, 1, 1]) == "3,1(x2)"


def test_ray_ranks_of_a_node_share_their_gpus_and_get_torchrun_node_variables(
    tmp_path: Path,
) -> None:
    """4 ranks with a GPU each over 2 Ray nodes, round-robin: each node's two actors got
    GPUs 0 and 1 there; both ranks of a node see both, the lower rank first."""
    place = Placement({}, RayOptions(), NodeZygotes(()))
    place.nodes = {
        f"worker-{i}": {
            "node_id": f"node-{i % 2}",
            "ip": "10.0.0.1",
            "host": "h",
            "gpus": str(i // 2),
        }
        for i in range(4)
    }
    launches = _launches(_envs(4), tmp_path)
    got = {la.replica: la.env for la in place.with_layout(launches)}
    assert got["worker-2"]["LOCAL_RANK"] == "1" and got["worker-2"]["GROUP_RANK"] == "0"
    assert got["worker-3"][NODE_DEVICES_ENV] == "0,1" == got["worker-1"]["CUDA_VISIBLE_DEVICES"]
    alone = {la.replica: la.env for la in place.with_layout([launches[3]])}
    assert alone["worker-3"]["LOCAL_RANK"] == "1" and alone["worker-3"]["GROUP_WORLD_SIZE"] == "2"
