"""The node check before a suspicious retry on a real Slurm allocation (issue 38): a 2-node
collective job on a 3-node allocation (tests/clusters/slurmcluster.py) fails with a real network
error when the link of rank 1's host is slowed; the check finds that host, it is left out
(`srun --exclude`), and the job finishes on the other two. Also the check itself, run by
the backend's code inside an allocation, finds a cut host and a slowed one.

This kernel has no netem (no sch_netem module), so a slowed link is a token bucket (`tc
qdisc ... tbf rate 2mbit`) on the host's cable: an 8 MiB all-reduce then takes far longer
than the job's 2 s gloo timeout, and the check's 1 MiB ones longer than its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import slurmcluster
from conftest import TG, wait_for
from hosts import Host
from slurm_jobs import TRAINGUARD, shared, slurm
from slurmcluster import SlurmCluster

pytest.importorskip("torch")  # the torch extra

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster
__all__ = ["shared", "slurm", "slurm_cluster"]  # fixtures, used by name

SLOW = ("tbf", "rate", "2mbit", "burst", "32kbit", "latency", "400ms")

# Each rank all-reduces 8 MiB a step with gloo's timeout at 2 s: milliseconds on a healthy
# link, a "Timed out waiting 2000ms" on a slowed one. Rank 0 writes the step it reached.
COLLECTIVE = textwrap.dedent(
    """
    import os, sys, time
    from datetime import timedelta
    from pathlib import Path
    import torch
    import torch.distributed as dist

    steps, out = int(sys.argv[1]), Path(sys.argv[2])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=2))
    x = torch.ones(1 << 21)
    for step in range(steps):
        y = x.clone()
        dist.all_reduce(y)
        assert float(y[0]) == world
        print(f"step {step} loss 0.5", flush=True)
        if rank == 0:
            out.write_text(f"{os.environ['TRAINGUARD_ATTEMPT']} {step}")
        time.sleep(0.1)
    dist.destroy_process_group()
    """
)


def _slow(host: Host) -> None:
    subprocess.run(["tc", "qdisc", "add", "dev", host.link, "root", *SLOW], check=True)


def _mend_link(host: Host) -> None:
    if host.cut_off:
        host.mend()


def _mend(host: Host) -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", host.link, "root"], check=False)


def _run_until_step_5_then(
    slurm: SlurmCluster, shared: Path, fault: Callable[[], None], mend: Callable[[], None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The collective job on 2 nodes of an allocation of 3; `fault` hits at step 5 of its
    first attempt. Returns (its one restart record, its status), once it succeeded."""
    script, progress = shared / "collective.py", shared / "progress"
    script.write_text(COLLECTIVE)
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), "PYTHONUNBUFFERED": "1"}
    argv = ["salloc", "-N3", "--no-kill", TRAINGUARD, "run", "--plain", "--job-name", "nc"]
    argv += ["--nodes", "2", "--nproc-per-node", "1", "--", sys.executable, str(script)]
    argv += ["40", str(progress)]
    proc = slurm.popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=shared
    )
    try:

        def at_step_5() -> bool:
            assert proc.poll() is None, proc.communicate()
            text = progress.read_text() if progress.exists() else ""
            return text.startswith("0 ") and int(text.split()[1]) >= 5

        wait_for(at_step_5, 120, "the first attempt at step 5")
        fault()
        out, err = proc.communicate(timeout=240)
    finally:
        mend()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (out + err)[-4000:]
    tg = TG(shared / "home")
    (rec,) = tg.json("records", "nc")
    after = tg.json("status", "nc")
    assert after["state"] == "SUCCEEDED" and after["attempts"] == 2
    assert [r["node"] for r in after["replicas"]] == ["tg-host-0", "tg-host-2"]
    return rec, after


def test_a_slowed_host_is_found_left_out_and_the_job_finishes_on_the_others(
    slurm: SlurmCluster, shared: Path
) -> None:
    host = slurm.hosts[1]  # rank 1's host: its link slows down mid-run
    rec, _ = _run_until_step_5_then(slurm, shared, lambda: _slow(host), lambda: _mend(host))
    isolated = rec["isolated"] or ""
    assert rec["failure_class"] == "retryable_message", rec
    assert "node check after a network or collective error" in isolated, rec
    assert "tg-host-1 its all-reduce" in isolated and "excluded from later attempts" in isolated
    print(f"\nslowed: restart record: {rec['rule']}: {isolated}")


def test_a_cut_host_is_left_out_and_the_job_finishes_on_the_others(
    slurm: SlurmCluster, shared: Path
) -> None:
    """A cut host's slurmd stops answering too: the backend's probe finds it lost first and
    excludes it, and a lost node calls for no check (the culprit is named already)."""
    host = slurm.hosts[1]
    rec, _ = _run_until_step_5_then(slurm, shared, host.cut, lambda: _mend_link(host))
    isolated = rec["isolated"] or ""
    assert rec["failure_class"] == "node_lost" and "tg-host-1" in isolated, rec
    assert "excluded from later attempts" in isolated, rec
    print(f"\ncut: restart record: {rec['rule']}: {isolated}")


IN_ALLOCATION = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from trainguard.backends.slurm import cluster
    from trainguard.backends.slurm.node_check import check_allocation
    async def main():
        Path(sys.argv[1], "ready").touch()  # the allocation is granted: the test may cut
        while not Path(sys.argv[1], "go").exists():
            time.sleep(0.05)
        alloc = await cluster.allocation()
        nodes = await cluster.nodes(alloc.nodes)
        found, out = await check_allocation(alloc.job_id, nodes, alloc.nodes, 2, "a test")
        print(json.dumps({"note": found.note, "excluded": out}))
    asyncio.run(main())
    """
)


def _check_in_allocation(slurm: SlurmCluster, shared: Path, cut: Host | None = None) -> Any:
    """The backend's check on the 3 nodes of an allocation; `cut` is cut once it is granted."""
    argv = ["salloc", "-N3", "--no-kill", sys.executable, "-c", IN_ALLOCATION, str(shared)]
    proc = slurm.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (shared / "ready").exists() or proc.poll() is not None, 120, "salloc")
        if cut is not None:
            cut.cut()
        (shared / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if cut is not None and cut.cut_off:
            cut.mend()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    for marker in ("ready", "go"):
        (shared / marker).unlink(missing_ok=True)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, err[-3000:]
    return json.loads(lines[-1])


def test_the_check_finds_a_cut_host_and_passes_healthy_ones(
    slurm: SlurmCluster, shared: Path
) -> None:
    healthy = _check_in_allocation(slurm, shared)
    assert healthy["excluded"] == {} and "every node passed" in healthy["note"], healthy
    found = _check_in_allocation(slurm, shared, cut=slurm.hosts[2])
    assert list(found["excluded"]) == ["tg-host-2"], found
    print(f"\ncut: {found['note']}")
