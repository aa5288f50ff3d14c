"""Processes a replica starts outside its process group end with it on a Ray node too
(issue 37): the shapes of tests/e2e/test_escapees_e2e.py (a new session, a new process group,
a double-forked daemon, a child that keeps the output pipe) after the replica's exit, a
stop and the host's close, first with the host as a plain object, then on the real
3-node cluster (tests/clusters/raycluster.py): after the job SUCCEEDS (cold and forked from the
node's zygote), a restart, a cancel, and the master SIGKILLed (its actors die with it)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TG, alive
from raycluster import DRIVER_ENV, LOOPBACK, RayCluster
from test_escapees_e2e import ESCAPE, SHAPES, _all_gone, _escapees

from trainguard.backends.ray.host import ReplicaHost

pytestmark = pytest.mark.slow


def _hosts(tmp_path: Path, then: str) -> tuple[Path, list[ReplicaHost]]:
    """One host per rank, each running the escaping replica (as Ray's actors would)."""
    out = tmp_path / "escapees"
    out.mkdir()
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    hosts = []
    for rank in range(len(SHAPES)):
        host = ReplicaHost()
        env = {**os.environ, "RANK": str(rank), "TRAINGUARD_RESTART_COUNT": "0"}
        info = host.start([sys.executable, str(script), str(out), then], env, str(tmp_path))
        assert "pid" in info, info
        hosts.append(host)
    return out, hosts


def _exit_of(host: ReplicaHost, deadline_s: float = 30) -> int:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        _, code = host.read(0.2)
        if code is not None:
            return code
    raise AssertionError(f"no exit within {deadline_s}s")


def test_a_hosts_escapees_end_when_its_replica_exits(tmp_path: Path) -> None:
    out, hosts = _hosts(tmp_path, "exit")
    left: list[int] = []
    try:
        left = _escapees(out, 0)
        assert [_exit_of(h) for h in hosts] == [0] * len(SHAPES)
        assert not [p for p in left if alive(p)]  # gone by the time the exit is reported
    finally:
        for host in hosts:
            host.close()
        _all_gone(left, "every escapee to end with its replica")


def test_a_hosts_escapees_end_with_a_stop_and_with_the_host(tmp_path: Path) -> None:
    out, hosts = _hosts(tmp_path, "forever")
    left: list[int] = []
    try:
        left = _escapees(out, 0)
        stopped, closed = hosts[:2], hosts[2:]
        for host in stopped:  # what the backend's stop sends, through the actor
            assert host.signal(signal.SIGTERM)
        assert [_exit_of(h) for h in stopped] == [-signal.SIGTERM] * 2
        assert not [p for p in left[:2] if alive(p)]
        for host in closed:  # the actor's end (the job's)
            host.close()
        assert not [p for p in left[2:] if alive(p)]
    finally:
        for host in hosts:
            host.close()
        _all_gone(left, "every escapee to end with its replica")


# ------------------------------------------------------------------ the real cluster


@pytest.fixture
def rtg(tg: TG, ray_cluster: RayCluster) -> TG:
    ray_cluster.heal()  # a node killed by an earlier test is replaced
    tg.env.update(DRIVER_ENV)
    return tg


def _job(tmp_path: Path, cluster: RayCluster, then: str, warm: bool) -> tuple[Path, str]:
    out = tmp_path / "escapees"
    out.mkdir()
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    data = {
        "name": "escapees",
        "backend": "ray",
        "ray": {"address": cluster.address, "driver_ip": LOOPBACK, "placement_timeout_s": 30},
        "success_policy": "all",
        "preload": ["json"] if warm else [],
        "worker_pools": [
            {
                "replicas": len(SHAPES),
                "command": [sys.executable, str(script), str(out), then],
                "resources": {"cpus": 1},
            }
        ],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return out, str(path)


@pytest.mark.ray
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "forked"])
def test_escapees_on_ray_end_when_the_job_succeeds(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, warm: bool
) -> None:
    out, job = _job(tmp_path, ray_cluster, "exit", warm)
    res = rtg("run", "--quiet", "-f", job, timeout=180)
    assert res.returncode == 0, res.stderr
    assert rtg.only_job()["state"] == "SUCCEEDED"
    _all_gone(_escapees(out, 0), "every escapee to end with the job")


@pytest.mark.ray
def test_escapees_on_ray_end_at_the_restart(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    out, job = _job(tmp_path, ray_cluster, "restart", False)
    proc = rtg.start("run", "--quiet", "-f", job)
    first: list[int] = []
    try:
        first = _escapees(out, 0)
        _escapees(out, 1)  # the next attempt is up: the first one's are gone already
        assert not [p for p in first if alive(p)]
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        _all_gone(first, "every escapee of the first attempt to end")
    _all_gone(_escapees(out, 1), "every escapee to end with the job")


@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["cancelled", "killed"])
def test_escapees_on_ray_end_when_the_master_is_stopped_or_killed(
    rtg: TG, ray_cluster: RayCluster, tmp_path: Path, sig: int
) -> None:
    """SIGKILL: the master's actors die with their driver, and each actor's guardian
    sweeps its runs' cgroups."""
    out, job = _job(tmp_path, ray_cluster, "forever", False)
    proc = rtg.start("run", "--quiet", "-f", job)
    try:
        left = _escapees(out, 0)
    finally:
        os.kill(proc.pid, sig)
        proc.wait(timeout=120)
    if sig == signal.SIGTERM:
        assert rtg.only_job()["state"] == "CANCELLED"
    try:
        _all_gone(left, "every escapee to end with the job or its master")
    finally:
        ray_cluster.heal()
