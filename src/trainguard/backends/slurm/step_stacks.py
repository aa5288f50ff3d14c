"""The stacks of one replica's process, taken on its own node: run there as a job step
(`srun --overlap ... python -m trainguard.backends.slurm.step_stacks JOB REPLICA RANK S
SLURM_JOB SLURM_STEP`).

The replica's process is the one on this node whose environment names the job and the
replica, and the Slurm step it runs in (the srun that started it, on the batch host,
carries the first two as well; its own children, a data loader's workers, carry all:
the eldest is it), not the `node_probe` wrapper it runs under.
Prints one JSON object, the stacks as `ReplicaStacks.to_dict` gives them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from trainguard.hangs.stack_dumps import dump_stacks
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.storage.env import ENV_JOB_ID, ENV_REPLICA

_WRAPPER = b"/slurm/node_probe.py\0"  # in the command line of the wrapper a task runs in


def find_replica(
    job_id: str, replica: str, step: tuple[str, str] | None = None, proc: Path = Path("/proc")
) -> int | None:
    """The pid of the replica's own process on this node, or None. `step`: (Slurm job id,
    step id) of the step it runs in."""
    want = {f"{ENV_JOB_ID}={job_id}".encode(), f"{ENV_REPLICA}={replica}".encode()}
    if step is not None:
        want |= {f"SLURM_JOB_ID={step[0]}".encode(), f"SLURM_STEP_ID={step[1]}".encode()}
    found: dict[int, int] = {}  # pid -> parent pid
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            stat = (entry / "stat").read_text()
            wrapper = _WRAPPER in (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if want <= env and not wrapper:
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tops = [pid for pid, parent in found.items() if parent not in found]
    return min(tops) if tops else None


def main(argv: list[str]) -> int:
    job_id, replica, rank, timeout_s = argv[0], argv[1], int(argv[2]), float(argv[3])
    step = (argv[4], argv[5]) if len(argv) >= 6 else None
    pid = find_replica(job_id, replica, step)
    if pid is None:
        host = os.uname().nodename
        snap = ReplicaStacks(
            replica, rank, 0, "none", False, f"no process of {replica} on {host}", 0.0, ()
        )
    else:
        (snap,) = asyncio.run(dump_stacks([(replica, rank, pid)], timeout_s=timeout_s))
    print(json.dumps(snap.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
