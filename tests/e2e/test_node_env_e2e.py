"""Every rank's environment on a real 3-node Slurm cluster (tests/clusters/slurmcluster.py),
compared with what real `srun torchrun` and `srun` give the same layout there (issue 37).

One job of 3 nodes x 2 ranks under trainguard, the same layout under `srun torchrun`
(static rendezvous, `--node-rank $SLURM_NODEID`) and under one `srun`: each rank writes its
whole environment to the hosts' shared folder. What torchrun sets (a worker's variables
that its agent's task did not have) must be what trainguard sets, rank by rank, but for
the few that are torchrun's own (`NOT_THE_LAYOUT`); Slurm's task variables must be what
one `srun` of the layout sets; each node's two ranks see the node's two GPUs, the lower rank's
first. tests/e2e/test_node_env_ray.py does the same on Ray."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import slurmcluster
import yaml
from node_env_dump import DUMP, NOT_THE_LAYOUT, differences, dumps, set_by_torchrun
from slurmcluster import SlurmCluster

pytest.importorskip("torch")  # torchrun: the torch extra

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster

TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))
NODES, PER_NODE = 3, 2
SLURM_LAYOUT = (
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NNODES",
    "SLURM_STEP_NUM_NODES",
    "SLURM_GTIDS",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NODELIST",
    "SLURM_STEP_NODELIST",
)


@pytest.fixture
def shared(slurm_cluster: SlurmCluster, request: pytest.FixtureRequest) -> Iterator[Path]:
    slurm_cluster.heal()
    folder = slurm_cluster.hosts.shared / request.node.name
    (folder / "out").mkdir(parents=True)
    (folder / "dump.py").write_text(DUMP)
    yield folder


def _run(slurm: SlurmCluster, argv: list[str], cwd: Path, **env: str) -> str:
    res = slurm.run(argv, env={**slurm.env, **env}, cwd=cwd, timeout=240)
    said = f"{argv}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert res.returncode == 0, said
    return said


def test_every_rank_gets_what_srun_torchrun_gives_the_same_layout(
    slurm_cluster: SlurmCluster, shared: Path
) -> None:
    slurm, out, dump = slurm_cluster, shared / "out", str(shared / "dump.py")
    world = NODES * PER_NODE
    job = {
        "name": "env",
        "backend": "slurm",
        "slurm": {"nodes": NODES, "tasks_per_node": PER_NODE},
        "gpu_inventory": [str(g) for g in range(world)],  # the master's list: ids 0-5
        "worker_pools": [
            {
                "replicas": world,
                "command": [sys.executable, dump, "tg", str(out)],
                "resources": {"gpus": 1},
            }
        ],
    }
    (shared / "job.yaml").write_text(yaml.safe_dump(job))
    spec = str(shared / "job.yaml")
    home = str(shared / "home")
    _run(
        slurm,
        ["salloc", f"-N{NODES}", "--no-kill", TRAINGUARD, "run", "--plain", "-f", spec],
        shared,
        TRAINGUARD_HOME=home,
    )
    tg = dumps(out, "tg", world)

    addr = tg[0]["MASTER_ADDR"]  # the first node: torchrun's store there too
    port = random.randint(20000, 40000)
    torchrun = (
        f"{sys.executable} {dump} base {out} && exec {sys.executable} -m torch.distributed.run "
        f"--nnodes={NODES} --nproc-per-node={PER_NODE} --node-rank=$SLURM_NODEID --role=worker "
        f"--master-addr={addr} --master-port={port} --rdzv-id={tg[0]['TORCHELASTIC_RUN_ID']} "
        f"--max-restarts={tg[0]['TORCHELASTIC_MAX_RESTARTS']} {dump} torchrun {out}"
    )
    srun = ["srun", f"-N{NODES}", "--ntasks-per-node=1"]
    _run(slurm, ["salloc", f"-N{NODES}", *srun, "bash", "-c", torchrun], shared)
    base = dumps(out, "base", NODES)
    ref = dumps(out, "torchrun", world)
    one_srun = ["srun", f"--ntasks-per-node={PER_NODE}", sys.executable, dump, "srun", str(out)]
    _run(slurm, ["salloc", f"-N{NODES}", f"--ntasks-per-node={PER_NODE}", *one_srun], shared)
    srun_ref = dumps(out, "srun", world)

    torchrun_sets = set_by_torchrun(ref, base)
    assert {"LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK"} <= torchrun_sets
    compared = sorted(torchrun_sets - NOT_THE_LAYOUT)
    left_out = sorted(torchrun_sets & NOT_THE_LAYOUT)
    print(f"\ncompared with torchrun: {compared}\nleft out: {left_out}")
    wrong = differences(tg, ref, compared) + differences(tg, srun_ref, SLURM_LAYOUT)
    assert not wrong, "\n".join(wrong)
    for env in tg:  # each node's ranks see its two GPUs; cuda:LOCAL_RANK is the rank's own
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1", env["CUDA_VISIBLE_DEVICES"]
        assert env["CUDA_VISIBLE_DEVICES"].split(",")[int(env["LOCAL_RANK"])] == str(
            int(env["RANK"]) % PER_NODE
        )
    hosts = [env["SLURMD_NODENAME"] for env in tg]
    assert hosts == [r["SLURMD_NODENAME"] for r in ref] == [r["SLURMD_NODENAME"] for r in srun_ref]
