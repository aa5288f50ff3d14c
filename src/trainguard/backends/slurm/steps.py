"""The job steps of an allocation, by name (each replica's step is named after it): which
run now, and cancelling those whose `srun` is gone but may still run on their node."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from trainguard.backends.slurm import cluster
from trainguard.backends.slurm.cluster import SlurmError


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
