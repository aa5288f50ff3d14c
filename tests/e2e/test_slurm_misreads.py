"""What a real Slurm allocation must not be misread as (issue 37), on the 3-node cluster of
tests/clusters/slurmcluster.py: a master out of file descriptors is no node's loss, and `scancel` of
an `salloc` allocation is a cancel, as under `sbatch`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import slurmcluster
from conftest import TG, wait_for
from slurm_jobs import TRAINGUARD, shared, slurm
from slurmcluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
slurm_cluster = slurmcluster.slurm_cluster  # the module's cluster
__all__ = ["shared", "slurm", "slurm_cluster"]  # fixtures, used by name

LIMIT = 40
"""The master's hard limit of files: enough to start (it holds ~17), not for 12 ranks each
its own srun step (each holds 3: its output pipe, its log file, its pidfd). With node
agents (the default) the same job needs 3 steps, and fits."""


def test_a_master_out_of_descriptors_loses_no_node(slurm: SlurmCluster, shared: Path) -> None:
    spec = shared / "job.yaml"
    spec.write_text(
        "name: fds\nbackend: slurm\n"
        "slurm: {nodes: 3, tasks_per_node: 4, drain_lost_nodes: true, agents: false}\n"
        "fault_tolerance: {max_internal_restarts: 1}\n"
        "worker_pools:\n  - role: worker\n    replicas: 12\n"
        "    command: [sleep, '60']\n"
    )
    limited = (  # the hard limit, where raising the soft one to it cannot help
        f"import os, resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, {LIMIT})); "
        f"os.execv({TRAINGUARD!r}, [{TRAINGUARD!r}, 'run', '--plain', '-f', {str(spec)!r}])"
    )
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), "PYTHONUNBUFFERED": "1"}
    argv = ["salloc", "-N3", "--no-kill", sys.executable, "-c", limited]
    proc = slurm.popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=shared
    )
    _out, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err[-3000:]
    tg = TG(shared / "home")
    status = tg.json("status", "fds")
    assert status["state"] == "FAILED" and status["error_code"] == "INTERNAL", status
    assert status["attempts"] == 2  # retried once, as an internal error
    records = tg.json("records", "fds")
    assert records, err[-3000:]
    # Each attempt ends on the first descriptor it lacks: a step's srun (the rule
    # own-resources) or another file of the master's (an internal error of the master).
    assert {r["failure_class"] for r in records} == {"internal"}, records
    assert not any(r.get("isolated") for r in records), records
    assert "Too many open files" in err and "does not answer" not in err, err[-3000:]
    for i in range(3):  # none drained, though the spec allowed it
        assert "DRAIN" not in slurm.node_state(i)

    def ended() -> bool:
        return not slurm.processes()

    wait_for(ended, 60, "every step of the job ended")


def test_scancel_of_an_salloc_allocation_is_a_cancel(slurm: SlurmCluster, shared: Path) -> None:
    """salloc, unlike sbatch, sends the master no signal when its allocation is revoked:
    the steps end under it ("Slurm job N has expired"), and that is the user's cancel."""
    env = {**slurm.env, "TRAINGUARD_HOME": str(shared / "home"), "PYTHONUNBUFFERED": "1"}
    run = [TRAINGUARD, "run", "--plain", "--job-name", "long", "--nodes", "2", "--"]
    job = [
        sys.executable,
        "-c",
        "import time\nfor i in range(10**6): print(i, flush=True); time.sleep(0.1)",
    ]
    proc = slurm.popen(
        ["salloc", "-N2", "--no-kill", *run, *job],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=shared,
    )
    tg = TG(shared / "home")

    def running() -> bool:
        assert proc.poll() is None, proc.communicate()
        status = tg.status_or_none("long") or {}
        return status.get("state") == "RUNNING" and len(slurm.processes()) >= 2

    wait_for(running, 120, "the job running on 2 nodes")
    time.sleep(2)
    ids = slurm.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    assert len(ids) == 1, ids
    assert slurm.run(["scancel", ids[0]]).returncode == 0
    _out, err = proc.communicate(timeout=120)
    print(err)
    status = tg.json("status", "long")
    assert status["state"] == "CANCELLED", (status, err[-3000:])
    assert tg.json("records", "long") == []  # nothing charged, nobody's failure

    def ended() -> bool:
        return not slurm.processes()

    wait_for(ended, 60, "every step of the job ended")
