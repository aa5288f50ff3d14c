"""GPU ids on Ray, both ways replicas run there (an actor per rank, or an agent per node),
on a real 2-node cluster whose nodes say they have 2 GPUs each (Ray's logical GPUs: Ray
hands out their ids with no GPU there). Each rank must see its node's GPUs, the ones Ray
reserved for that node's bundles, in local-rank order: `cuda:LOCAL_RANK` is its own."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import TG
from raycluster import DRIVER_ENV, LOOPBACK, RayCluster, require_ray

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# Each rank waits for the others' files: rank 0's success ends the job (the default
# success policy), and the ranks still running are stopped.
DUMP = """
import json, os, sys, time
keys = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK")
out = {k: os.environ.get(k) for k in keys}
with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}.json"), "w") as fh:
    json.dump(out, fh)
world = int(os.environ["WORLD_SIZE"])
until = time.time() + 60
while len(os.listdir(sys.argv[1])) < world and time.time() < until:
    time.sleep(0.05)
"""


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[RayCluster]:
    require_ray()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in DRIVER_ENV.items():
            patch.setenv(name, value)
        root = Path(tempfile.mkdtemp(prefix="ray-tg-gpus-", dir="/tmp"))
        cluster = RayCluster(root, num_cpus=2, num_nodes=2, num_gpus=2)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


@pytest.mark.parametrize("agents", [False, True], ids=["actor-per-rank", "node-agents"])
def test_each_rank_sees_its_nodes_gpus_in_local_rank_order(
    tmp_path: Path, gpu_cluster: RayCluster, agents: bool
) -> None:
    gpu_cluster.wait_idle()
    tg = TG(tmp_path / "home")
    tg.env.update(DRIVER_ENV)
    out, dump = tmp_path / "out", tmp_path / "dump.py"
    out.mkdir()
    dump.write_text(DUMP)
    job = {
        "name": "gpus",
        "backend": "ray",
        "ray": {
            "address": gpu_cluster.address,
            "driver_ip": LOOPBACK,
            "placement_strategy": "pack",
            "placement_timeout_s": 60,
            "agents": agents,
        },
        "worker_pools": [
            {
                "replicas": 4,
                "command": [sys.executable, str(dump), str(out)],
                "resources": {"cpus": 1, "gpus": 1},
            }
        ],
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    res = tg("run", "--quiet", "-f", str(tmp_path / "job.yaml"), timeout=240)
    assert res.returncode == 0, res.stderr
    nodes = {r["rank"]: r["node"] for r in tg.only_job()["replicas"]}
    seen = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in range(4)}
    by_node: dict[str, list[dict[str, str]]] = {}
    for rank, node in sorted(nodes.items()):
        by_node.setdefault(node, []).append(seen[rank])
    assert len(by_node) == 2, nodes  # 2 GPUs a node: 2 ranks on each
    for ranks in by_node.values():
        devices = {r["CUDA_VISIBLE_DEVICES"] for r in ranks}
        assert len(devices) == 1, ranks  # the node's GPUs, the same for each of its ranks
        ids = devices.pop().split(",")
        assert sorted(ids) == ["0", "1"], ranks  # the 2 Ray reserved there, each once
        assert sorted(r["LOCAL_RANK"] for r in ranks) == ["0", "1"], ranks
