"""Every rank's environment on a real 3-node Ray cluster (tests/clusters/raycluster.py),
compared with what real torchrun gives the same layout (issue 37).

6 ranks of one CPU each, packed on 3 nodes of 2 CPUs: each node holds two consecutive
ranks. torchrun gets the same layout from 3 agents (`--node-rank` 0-2, static rendezvous
at rank 0's address), one per Ray node's worth of ranks. What torchrun sets (a worker's
variables that its agent did not have) must be what trainguard sets, rank by rank, but
for the few that are torchrun's own (`NOT_THE_LAYOUT`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TG
from node_env_dump import DUMP, NOT_THE_LAYOUT, differences, dumps, set_by_torchrun
from raycluster import DRIVER_ENV, LOOPBACK, RayCluster

from trainguard.backends.net import free_port

pytest.importorskip("torch")  # torchrun: the torch extra

pytestmark = [pytest.mark.slow, pytest.mark.ray]
NODES, PER_NODE = 3, 2


@pytest.mark.parametrize("node_agents", [False, True], ids=["actor-per-rank", "node-agents"])
def test_every_rank_on_ray_gets_what_torchrun_gives_the_same_layout(
    tg: TG, ray_cluster: RayCluster, tmp_path: Path, node_agents: bool
) -> None:
    ray_cluster.heal()
    tg.env.update(DRIVER_ENV)
    out, dump = tmp_path / "out", tmp_path / "dump.py"
    out.mkdir()
    dump.write_text(DUMP)
    world = NODES * PER_NODE
    job = {
        "name": "env",
        "backend": "ray",
        "ray": {
            "address": ray_cluster.address,
            "driver_ip": LOOPBACK,
            "placement_strategy": "pack",
            "placement_timeout_s": 60,
            "agents": node_agents,
        },
        "worker_pools": [
            {
                "replicas": world,
                "command": [sys.executable, str(dump), "tg", str(out)],
                "resources": {"cpus": 1},
            }
        ],
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    res = tg("run", "--quiet", "-f", str(tmp_path / "job.yaml"), timeout=240)
    assert res.returncode == 0, res.stderr
    nodes = [r["node"] for r in tg.only_job()["replicas"]]
    assert all(nodes[2 * k] == nodes[2 * k + 1] for k in range(NODES)), nodes
    assert len(set(nodes)) == NODES, nodes
    got = dumps(out, "tg", world)

    port = free_port(LOOPBACK)
    agents = []
    for k in range(NODES):
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={NODES}",
            f"--nproc-per-node={PER_NODE}",
            f"--node-rank={k}",
            f"--master-addr={got[0]['MASTER_ADDR']}",
            f"--master-port={port}",
            "--role=worker",
            f"--rdzv-id={got[0]['TORCHELASTIC_RUN_ID']}",
            f"--max-restarts={got[0]['TORCHELASTIC_MAX_RESTARTS']}",
            str(dump),
            "torchrun",
            str(out),
        ]
        env = {**os.environ, "TG_NODE": str(k)}
        subprocess.run([sys.executable, str(dump), "base", str(out)], env=env, check=True)
        agents.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL))
    for agent in agents:
        assert agent.wait(timeout=240) == 0
    ref, base = dumps(out, "torchrun", world), dumps(out, "base", NODES)

    torchrun_sets = set_by_torchrun(ref, base)
    assert {"LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "ROLE_RANK"} <= torchrun_sets
    compared = sorted(torchrun_sets - NOT_THE_LAYOUT)
    print(f"\ncompared with torchrun: {compared}")
    wrong = differences(got, ref, compared)
    assert not wrong, "\n".join(wrong)
