"""The job steps of an allocation, by name (each replica's step is named after it): which
run now, cancelling those whose `srun` is gone but may still run on their node, and a
replica's stacks taken by a step beside its own."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Sequence

from trainguard.backends.slurm import cluster
from trainguard.backends.slurm.cluster import SlurmError
from trainguard.hangs.stack_model import ReplicaStacks


async def of_job(job_id: str) -> dict[str, str]:
    """replica -> step id of its step in the allocation now (by the step's name)."""
    try:
        text = await cluster.run_slurm(["squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i %j"])
    except SlurmError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        step, _, name = line.strip().partition(" ")
        if "." in step and name:
            out[name.strip()] = step.split(".", 1)[1]
    return out


async def cancel(job_id: str, replicas: Sequence[str]) -> None:
    """A step whose srun is gone may still run on its node: cancel it there."""
    if not replicas:
        return
    found = await of_job(job_id)
    ids = [f"{job_id}.{found[r]}" for r in replicas if r in found]
    if ids:
        with contextlib.suppress(SlurmError):
            await cluster.run_slurm(["scancel", "--signal=KILL", *ids])


async def stacks(
    slurm_job: str,
    node: str,
    job_id: str,
    target: tuple[str, int, int],
    timeout_s: float,
    step: tuple[str, str] | None,
) -> ReplicaStacks:
    """py-spy on `node`, in a step overlapping the replica's (`step_stacks` finds its process
    there by trainguard's `job_id`, its name, and its own `step` when known)."""
    name, rank, pid = target
    argv = [
        "srun",
        f"--jobid={slurm_job}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--job-name=stacks-{name}",
        sys.executable,
        "-m",
        "trainguard.backends.slurm.step_stacks",
        job_id,
        name,
        str(rank),
        f"{timeout_s:g}",
        *(step or ()),
    ]
    try:
        out = await cluster.run_slurm(argv, timeout_s=timeout_s + 15)
        return ReplicaStacks.from_dict(json.loads(out.strip().splitlines()[-1]))
    except (SlurmError, ValueError, KeyError, IndexError) as exc:
        why = f"stacks on {node} through srun failed: {exc}"
        return ReplicaStacks(name, rank, pid, "none", False, why, 0.0, ())
