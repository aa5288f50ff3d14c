"""The Ray backend against a real 3-node Ray cluster on loopback (tests/clusters/raycluster.py).
DDP across nodes, the loss of a node under it and a hang's stacks dumped on each replica's
node are tested on hosts that share nothing (tests/clusters/test_hosts.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, TG, alive, child, wait_for
from raycluster import DRIVER_ENV, LOOPBACK, RayCluster

pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture
def rtg(tg: TG, ray_cluster: RayCluster) -> TG:
    """The CLI as a driver of the test cluster (loopback only)."""
    ray_cluster.heal()  # a node killed by an earlier test is replaced
    ray_cluster.wait_idle()
    tg.env.update(DRIVER_ENV)
    return tg


def spec(
    tmp_path: Path,
    cluster: RayCluster,
    replicas: int,
    command: list[str],
    cpus: float = 1,
    placement_timeout_s: float = 20,
    agents: bool | None = None,
    **extra: Any,
) -> str:
    """`agents`: None for the engine's default (`ray.agents`)."""
    data = {
        "name": extra.pop("name", "on-ray"),
        "backend": "ray",
        "ray": {
            "address": cluster.address,
            "driver_ip": LOOPBACK,
            "placement_timeout_s": placement_timeout_s,
            **({} if agents is None else {"agents": agents}),
        },
        "worker_pools": [
            {"replicas": replicas, "command": command, "resources": {"cpus": cpus}},
        ],
        **extra,
    }
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _status(tg: TG) -> dict[str, Any] | None:
    jobs = tg.json("jobs")
    return tg.json("status", jobs[0]["id"]) if jobs else None


def _wait_running(tg: TG, proc: subprocess.Popen[str]) -> None:
    """Until the job runs; a master that ends first fails the test with what it said."""
    wait_for(
        lambda: proc.poll() is not None or ((s := _status(tg)) and s["state"] == "RUNNING"),
        120,
        "the job to run",
    )
    if proc.poll() is not None:
        _, err = proc.communicate()
        pytest.fail(f"the master ended ({proc.returncode}) before the job ran:\n{err}")


def _step(tg: TG) -> int:
    """The last step rank 0 printed ("step N loss ...")."""
    text = tg("logs", "ddp", "--tail", "5").stdout
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    return max(steps, default=0)


AGENTS = pytest.mark.parametrize("agents", [False, True], ids=["actor-per-rank", "node-agents"])
"""Both ways replicas run on Ray: an actor per rank, or an agent per node (`ray.agents`)."""


@AGENTS
def test_a_bug_is_not_retried_on_ray(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, agents: bool
) -> None:
    command = child("1:sleep:0.5", "1:raise:KeyError", "0:sleep:30")
    job = spec(tmp_path, ray_cluster, 2, command, agents=agents)
    res = rtg("run", "--quiet", "-f", job, timeout=120)
    assert res.returncode == 1, res.stderr
    status = rtg.only_job()
    assert status["state"] == "FAILED" and status["attempts"] == 1
    assert "KeyError" in status["error_message"]


@AGENTS
def test_cancel_leaves_no_replica_on_any_node(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, agents: bool
) -> None:
    pids = tmp_path / "pid"
    job = spec(tmp_path, ray_cluster, 3, child(f"*:pidfile:{pids}", "*:forever"), agents=agents)
    proc = rtg.start("run", "--quiet", "-f", job)
    wait_for(lambda: all(Path(f"{pids}.{r}").is_file() for r in range(3)), 120, "3 replicas")
    started = [int(Path(f"{pids}.{r}").read_text()) for r in range(3)]
    assert all(alive(p) for p in started)
    # who forked them: their node's agent, or the actor of each rank
    agent = "trainguard.backends.agent.node"
    assert all(any(agent in c for c in _forebears(p)) == agents for p in started)
    proc.send_signal(signal.SIGINT)  # Ctrl+C
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    wait_for(lambda: not any(alive(p) for p in started), 15, "every replica to be gone")
    assert rtg.only_job()["state"] == "CANCELLED"


def _forebears(pid: int) -> list[str]:
    """The command lines of the process's parent, its parent's, and so on up."""
    out = []
    while pid > 1:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            pid = int(status.split("PPid:")[1].split()[0])
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            break
    return out


def _end(proc: subprocess.Popen[str]) -> None:
    """A master a failed test leaves behind would hold the cluster for the next test."""
    if proc.poll() is None:
        spy = Path(sys.executable).with_name("py-spy")
        dump = subprocess.run(
            [str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, text=True, check=False
        )
        print(f"the master's stacks:\n{dump.stdout}{dump.stderr}")
        proc.kill()
        _, err = proc.communicate()
        print(f"the master was still running; its stderr:\n{err}")


def _a_worker_node(cluster: RayCluster) -> int:
    return int(max(n["index"] for n in cluster.nodes()))  # alive, and not the head (0)


def _whole_cluster_job(
    tmp_path: Path, cluster: RayCluster, agents: bool | None = None, **extra: Any
) -> str:
    """3 replicas of 2 cpus: every cpu of the 3 nodes. Attempt 0 waits to be cut down."""
    command = child("*:print:up", "*@0:forever", "*:print:done")
    return spec(
        tmp_path, cluster, 3, command, cpus=2, placement_timeout_s=3, agents=agents, **extra
    )


@AGENTS
def test_too_few_nodes_left_fails_with_a_clear_message(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, agents: bool
) -> None:
    proc = rtg.start("run", "--quiet", "-f", _whole_cluster_job(tmp_path, ray_cluster, agents))
    _wait_running(rtg, proc)
    ray_cluster.kill_node(_a_worker_node(ray_cluster))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    status = rtg.only_job()
    assert status["state"] == "FAILED" and status["error_code"] == "CAPACITY"
    assert "could not place 3 replica(s)" in status["error_message"]
    assert "Traceback" not in err


def test_too_few_nodes_left_waits_for_capacity_when_asked(
    rtg: TG,
    ray_cluster: RayCluster,
    tmp_path: Path,
) -> None:
    job = _whole_cluster_job(
        tmp_path, ray_cluster, queue={"wait_for_capacity": True, "capacity_retry_s": 1}
    )
    proc = rtg.start("run", "--quiet", "-f", job)
    try:
        _wait_running(rtg, proc)
        ray_cluster.kill_node(_a_worker_node(ray_cluster))
        wait_for(
            lambda: "waiting for capacity" in (rtg.only_job()["queued_reason"] or ""),
            60,
            "the job to wait for capacity",
        )
        ray_cluster.heal()  # a node comes back: the job goes on
        _, err = proc.communicate(timeout=180)
    finally:
        _end(proc)
    assert proc.returncode == 0, err
    assert rtg.only_job()["state"] == "SUCCEEDED"


@AGENTS
def test_a_killed_master_takes_its_replicas_along_and_resume_goes_on(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, agents: bool
) -> None:
    pids = tmp_path / "pid"
    command = child(f"*@0:pidfile:{pids}", "*@0:forever", "*:print:ok")
    job = spec(tmp_path, ray_cluster, 2, command, agents=agents)
    proc = rtg.start("run", "--quiet", "-f", job)
    wait_for(lambda: all(Path(f"{pids}.{r}").is_file() for r in range(2)), 120, "2 replicas")
    started = [int(Path(f"{pids}.{r}").read_text()) for r in range(2)]
    proc.send_signal(signal.SIGKILL)  # no goodbye: Ray reaps the actors of a dead driver
    proc.wait()
    wait_for(lambda: not any(alive(p) for p in started), 30, "every replica to be gone")
    assert rtg.only_job()["state"] == "INTERRUPTED"
    res = rtg("resume", "--quiet", "on-ray", timeout=120)
    assert res.returncode == 0, res.stderr
    status = rtg.only_job()
    assert status["state"] == "SUCCEEDED" and status["attempts"] == 2


@AGENTS
def test_a_torchft_group_on_ray_restarts_alone_and_heals_from_its_peer(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, agents: bool
) -> None:
    """torchft's groups, Lighthouse and stores placed on the cluster's nodes (each at its
    node's address); a killed group restarts alone on its node and heals."""
    pytest.importorskip("torchft")
    example = str(ROOT / "examples" / "torchft_train.py")
    out = tmp_path / "out"
    data = {
        "name": "ft-on-ray",
        "framework": "torchft",
        "backend": "ray",
        "ray": {"address": ray_cluster.address, "driver_ip": LOOPBACK, "agents": agents},
        "worker_pools": [
            {
                "replicas": 2,
                "command": [
                    sys.executable,
                    example,
                    "--steps",
                    "200",
                    "--step-time",
                    "0.03",
                    "--out",
                    str(out),
                ],
                "resources": {"cpus": 1},
            }
        ],
        "fault_injection": ["signal:worker-1:SIGKILL@6s"],
    }
    path = tmp_path / "ft.yaml"
    path.write_text(yaml.safe_dump(data))
    res = rtg("run", "--quiet", "-f", str(path), timeout=240)
    status = _status(rtg)
    assert res.returncode == 0 and status is not None, res.stderr[-3000:]
    assert status["state"] == "SUCCEEDED"
    restarts = rtg.json("records", status["id"])
    assert [str(r["decision"]).split(":")[0] for r in restarts] == ["RestartGroup(group 1"]
    runs = {r["name"]: r for r in status["replicas"]}
    assert runs["worker-0"]["restart"] == 0 and runs["worker-1"]["restart"] == 1
    digests = {p.read_text() for p in out.glob("group-*.sha")}
    assert len(list(out.glob("group-*.sha"))) == 2 and len(digests) == 1
