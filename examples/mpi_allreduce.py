"""A small deterministic MPI job (mpi4py): an allreduce loop that checkpoints and resumes.

Every step each rank derives a contribution from (state, step, rank), the ranks sum them
with MPI allreduce, and the state moves on from that sum. The arithmetic is on integers
modulo a prime, so the result does not depend on the order MPI adds in, and a run that is
killed and resumed from its checkpoint ends with exactly the state of a run that never was.
Rank 0 writes the checkpoint (atomic rename) every --ckpt-every steps and reads it back on
start; the other ranks get it by broadcast, so only rank 0 needs to see --ckpt-dir.

    mpirun -np 2 python examples/mpi_allreduce.py --ckpt-dir /tmp/ck --out /tmp/final.json
    trainguard: framework: mpi, launcher command `python examples/mpi_allreduce.py ...`

Demo faults as in ddp_train.py: --crash-at-step (SIGKILL, first attempt only, as told by
TRAINGUARD_RESTART_COUNT), --bug-at-step (a KeyError, every attempt), --hang-at-step.
An uncaught exception must not reach MPI_Finalize (the job would hang there):
trainguard.backends.mpi.launch.exit_on_error wraps the command so the rank exits at once instead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

PRIME = 2_147_483_647  # 2**31 - 1: products of two residues fit in int64
WIDTH = 8


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--ckpt-dir", default="mpi-ckpt")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--out", help="where rank 0 writes the final state (JSON)")
    p.add_argument(
        "--crash-at-step",
        type=int,
        help="demo fault: on the first attempt only, rank --crash-rank SIGKILLs itself here",
    )
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument(
        "--bug-at-step", type=int, help="demo fault: rank --crash-rank hits a KeyError here"
    )
    p.add_argument(
        "--hang-at-step",
        type=int,
        help="demo fault: on the first attempt only, rank --crash-rank sleeps forever here",
    )
    return p.parse_args()


def _write_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _initial_state() -> np.ndarray:
    return np.arange(1, WIDTH + 1, dtype=np.int64)


def _contribution(state: np.ndarray, step: int, rank: int) -> np.ndarray:
    """What this rank adds in: a function of (state, step, rank) only."""
    lanes = np.arange(WIDTH, dtype=np.int64)
    return (state * (rank + 3) + step * 7919 + rank * 104729 + lanes) % PRIME


def _load(ckpt: Path) -> tuple[int, np.ndarray]:
    if not ckpt.exists():
        return 0, _initial_state()
    data = json.loads(ckpt.read_text())
    return int(data["step"]), np.array(data["state"], dtype=np.int64)


def main() -> None:
    args = _args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    restart = int(os.environ.get("TRAINGUARD_RESTART_COUNT", "0"))
    ckpt = Path(args.ckpt_dir) / "checkpoint.json"
    loaded = None
    if rank == 0:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        loaded = _load(ckpt)
    start, state = comm.bcast(loaded, root=0)
    if start:
        print(f"rank {rank}: resumed from step {start} (restart {restart})", flush=True)
    total = np.empty(WIDTH, dtype=np.int64)
    for step in range(start + 1, args.steps + 1):
        first_attempt = restart == 0
        if step == args.hang_at_step and rank == args.crash_rank and first_attempt:
            while True:  # the peers wait for this rank in the allreduce
                time.sleep(3600)
        comm.Allreduce(_contribution(state, step, rank), total, op=MPI.SUM)
        state = (state * 31 + total) % PRIME
        print(f"step {step} rank {rank} head {int(state[0])} t={time.time():.6f}", flush=True)
        if step == args.crash_at_step and rank == args.crash_rank and first_attempt:
            print(f"injected fault: rank {rank} SIGKILLs itself t={time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.bug_at_step and rank == args.crash_rank:
            config: dict[str, float] = {}
            print(f"learning rate {config['lr']}")  # a bug: raises KeyError
        if rank == 0 and step % args.ckpt_every == 0:
            _write_atomic(ckpt, {"step": step, "state": state.tolist()})
        if args.step_time:
            time.sleep(args.step_time)

    if rank == 0:
        final = {"steps": args.steps, "size": size, "state": state.tolist()}
        if args.out:
            _write_atomic(Path(args.out), final)
        print(f"final state {json.dumps(final['state'])}", flush=True)


if __name__ == "__main__":
    main()
