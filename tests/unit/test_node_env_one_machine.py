"""One machine as one node (issue 37): the GPUs the master hands each rank laid out as
torchrun's, so every rank's `CUDA_VISIBLE_DEVICES.split(',')[LOCAL_RANK]` is its own, for a
whole attempt, a rank restarted alone, an attempt after an isolation and torchft's groups;
a pool's own setting and ranks that are no torchrun rank keep theirs.
tests/e2e/test_hangs_e2e.py checks it with real processes."""

from __future__ import annotations

from pathlib import Path

from test_node_env import _envs

from trainguard.backends.interface import Launch
from trainguard.backends.local.node_layout import NodeLayout, without_own
from trainguard.frameworks import preset
from trainguard.frameworks.node_env import DEVICES, OWN_DEVICES, placed_envs
from trainguard.frameworks.replica_plan import plan_replicas
from trainguard.master.launch import LaunchBuilder
from trainguard.spec.models import validate_spec


def _handed(envs: dict[str, dict[str, str]], ids: list[int]) -> dict[str, dict[str, str]]:
    """What master/launch.py gives each replica: its own id, and the note of it."""
    return {
        r: {**env, DEVICES: str(g), OWN_DEVICES: str(g)}
        for (r, env), g in zip(envs.items(), ids, strict=True)
    }


def _launches(envs: dict[str, dict[str, str]], attempt: int = 0, restart: int = 0) -> list[Launch]:
    return [
        Launch(attempt, r, int(env["RANK"]), restart, ("t",), env, "/w", Path("/l") / r)
        for r, env in envs.items()
    ]


def _own(launch: Launch) -> str:
    return launch.env[DEVICES].split(",")[int(launch.env["LOCAL_RANK"])]


def test_every_rank_sees_the_attempt_gpus_its_own_at_local_rank() -> None:
    envs = _handed(_envs(3), [0, 1, 2])
    got = NodeLayout().apply(_launches(envs))
    assert [la.env[DEVICES] for la in got] == ["0,1,2"] * 3
    assert [_own(la) for la in got] == ["0", "1", "2"]
    assert not any(OWN_DEVICES in la.env for la in got)  # no process sees the note


def test_after_an_isolation_the_next_attempt_is_laid_out_anew() -> None:
    layout = NodeLayout()
    layout.apply(_launches(_handed(_envs(3), [0, 1, 2])))
    got = layout.apply(_launches(_handed(_envs(3), [0, 2, 3]), attempt=1))  # GPU 1 out
    assert [la.env[DEVICES] for la in got] == ["0,2,3"] * 3
    assert [_own(la) for la in got] == ["0", "2", "3"]


def test_a_rank_restarted_alone_keeps_its_own_gpu_at_its_local_rank() -> None:
    layout = NodeLayout()
    envs = _handed(_envs(3), [4, 5, 6])
    layout.apply(_launches(envs))
    (got,) = layout.apply(_launches({"worker-1": envs["worker-1"]}, restart=1))
    assert (got.env[DEVICES], _own(got)) == ("4,5,6", "5")


def test_torchft_groups_each_see_their_own_ranks_gpus() -> None:
    envs = {
        r: e
        for r, e in _envs(4, "torchft", torchft={"nproc_per_group": 2}).items()
        if r.startswith("worker-")
    }
    got = NodeLayout().apply(_launches(_handed(envs, [0, 1, 2, 3])))
    assert [la.env[DEVICES] for la in got] == ["0,1", "0,1", "2,3", "2,3"]
    assert [_own(la) for la in got] == ["0", "1", "2", "3"]
    ranks = {r: (int(e["RANK"]), e) for r, e in envs.items()}  # Slurm and Ray alike
    by_group = placed_envs(
        ranks, dict.fromkeys(envs, "n0"), {r: (str(i),) for i, r in enumerate(envs)}
    )
    assert [by_group[r][DEVICES] for r in envs] == ["0,1", "0,1", "2,3", "2,3"]


def test_a_pool_setting_and_a_replica_that_is_no_torchrun_rank_keep_theirs() -> None:
    envs = _handed(_envs(2), [0, 1])
    envs["worker-1"][DEVICES] = "7"  # the pool's own setting: the master noted no ids
    del envs["worker-1"][OWN_DEVICES]
    got = NodeLayout().apply(_launches(envs))
    assert [la.env[DEVICES] for la in got] == ["0", "7"]
    generic = _handed(_envs(2, "generic"), [0, 1])
    got = NodeLayout().apply(_launches(generic))
    assert [la.env[DEVICES] for la in got] == ["0", "1"]
    assert not any(OWN_DEVICES in la.env for la in got)


def test_without_the_layout_only_the_note_goes() -> None:
    (la,) = _launches(_handed(_envs(1), [3]))
    assert without_own(la).env == {k: v for k, v in la.env.items() if k != OWN_DEVICES}


def test_the_master_notes_the_ids_it_hands_out_unless_the_pool_sets_its_own(
    tmp_path: Path,
) -> None:
    spec = validate_spec(
        {
            "name": "x",
            "worker_pools": [
                {"role": "a", "replicas": 1, "command": ["t"]},
                {"role": "b", "replicas": 1, "command": ["t"], "env": {DEVICES: "7"}},
            ],
        }
    )
    plans = tuple(plan_replicas(spec))
    builder = LaunchBuilder("job-1", preset("pytorch"), plans, tmp_path, "/w", 3, spec)
    a, b = (builder.build(p, 0, 0, ("127.0.0.1", 1), {}, "2") for p in plans)
    assert (a.env[DEVICES], a.env[OWN_DEVICES]) == ("2", "2")
    assert b.env[DEVICES] == "7" and OWN_DEVICES not in b.env
