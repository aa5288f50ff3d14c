"""A small deterministic PyTorch DDP training job (gloo, CPU), written as for torchrun.

It reads only the standard variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT), checkpoints every N steps with an atomic rename, and resumes
from its checkpoint. Data are derived from (step, rank), so a run that is killed and
resumed ends with exactly the weights of a run that never was.

    trainguard run --nproc-per-node 2 -- python examples/ddp_train.py --ckpt-dir /tmp/ck
    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py --ckpt-dir /tmp/ck
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainguard import sdk


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-dir", default="ddp-ckpt")
    p.add_argument("--out", help="where rank 0 writes the final weights")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--hidden", type=int, default=64, help="width of the hidden layer")
    p.add_argument(
        "--crash-at-step",
        type=int,
        help="demo fault: on the first attempt only, rank --crash-rank SIGKILLs itself here",
    )
    p.add_argument(
        "--snapshot",
        action="store_true",
        help="keep every step's state in memory with trainguard.sdk.snapshot and resume from "
        "the newest one all ranks hold (a killed rank then costs one step)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="checkpoint through trainguard.sdk.report into the job's checkpoint storage "
        "(what every host of a multi-host job sees) and resume from sdk.get_checkpoint(); "
        "--ckpt-dir is then only the folder rank 0 writes each checkpoint in first",
    )
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument(
        "--bug-at-step", type=int, help="demo fault: rank --crash-rank hits a KeyError here"
    )
    p.add_argument(
        "--timeout-at-step",
        type=int,
        help="demo fault: on every attempt, rank --crash-rank raises here a RuntimeError that "
        "reads like an NCCL collective timeout (deterministic: the same error, the same step)",
    )
    p.add_argument(
        "--hang-at-step",
        type=int,
        help="demo fault: on the first attempt only, rank --crash-rank sleeps forever here",
    )
    return p.parse_args()


def _model(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def _save_atomic(obj: object, path: Path) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(tensor.detach().contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


def _stall_forever() -> None:
    while True:
        time.sleep(3600)


def _saved_state(args: argparse.Namespace, ckpt: Path) -> tuple[dict[str, Any], str] | None:
    """The newest state to resume from, and where it came from; None on a first run."""
    state = torch.load(ckpt, weights_only=True) if ckpt.exists() and not args.report else None
    where = "checkpoint"
    if args.report and (reported := sdk.get_checkpoint()) is not None:
        state = torch.load(Path(reported) / "checkpoint.pt", weights_only=True)
        where = f"reported checkpoint {Path(reported).name}"
    if args.snapshot:
        found = sdk.load_snapshot()  # the newest step every rank holds, memory or disk
        if found is not None and (state is None or found[0] >= int(state["step"])):
            state, where = found[1], "snapshot"
    return None if state is None else (state, where)


def _demo_faults(args: argparse.Namespace, step: int, rank: int, restart: int) -> None:
    """The faults the demo and the tests ask for, on the crash rank at their step."""
    if step == args.crash_at_step and restart == 0:
        print(f"injected fault: rank {rank} SIGKILLs itself t={time.time():.6f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if step == args.timeout_at_step:
        raise RuntimeError(
            f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL("
            f"SeqNum={3 * step}, OpType=ALLREDUCE, NumelIn=2177, NumelOut=2177, "
            "Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
        )
    if step == args.bug_at_step:
        config: dict[str, float] = {}
        print(f"learning rate {config['lr']}")  # a bug: raises KeyError


def _checkpoint_now(
    rank: int, step: int, model: nn.Module, opt: torch.optim.Optimizer, loss: float, ckpt: Path
) -> None:
    """A preemption notice (`sdk.preempted()`): rank 0 checkpoints this step at once."""
    print(f"rank {rank}: preemption notice at step {step}", flush=True)
    if rank == 0:
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        _save_atomic(state, ckpt)
        sdk.report({"step": step, "loss": loss}, checkpoint=str(ckpt.parent))


def main() -> None:
    args = _args()
    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))

    model = _model(args.hidden)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = ckpt_dir / "checkpoint.pt"
    start = 0
    found = _saved_state(args, ckpt)
    if found is not None:
        state, where = found
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from {where} of step {start} (restart {restart})", flush=True)
    step_s: list[float] = []
    snap_s: list[float] = []
    noticed = False  # a preemption notice was acted on

    for step in range(start + 1, args.steps + 1):
        t_step = time.perf_counter()
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(64, 32, generator=gen)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        loss = nn.functional.mse_loss(ddp(x), y)
        if step == args.hang_at_step and rank == args.crash_rank and restart == 0:
            _stall_forever()  # the peers wait for this rank in the gradient all-reduce
        opt.zero_grad()
        loss.backward()
        opt.step()
        if args.snapshot:
            t_snap = time.perf_counter()
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            sdk.snapshot(state, step)
            snap_s.append(time.perf_counter() - t_snap)
        step_s.append(time.perf_counter() - t_step)
        print(f"step {step} loss {loss.item():.6f} rank {rank} t={time.time():.6f}", flush=True)
        if rank == args.crash_rank:
            _demo_faults(args, step, rank, restart)
        if step % args.ckpt_every == 0 and rank == 0:
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            _save_atomic(state, ckpt)
            if args.report:  # committed into the job's storage, then the master is told
                sdk.report({"step": step, "loss": loss.item()}, checkpoint=str(ckpt_dir))
        elif args.report:
            sdk.heartbeat(step)
            if not noticed and sdk.preempted():  # the job is about to be stopped: save now
                noticed = True
                _checkpoint_now(rank, step, model, opt, loss.item(), ckpt)
        if args.step_time:
            time.sleep(args.step_time)

    if snap_s:
        cost, whole = statistics.median(snap_s), statistics.median(step_s)
        print(
            f"snapshot cost rank {rank}: {cost * 1000:.3f} ms median per step, "
            f"{100 * cost / whole:.1f}% of a step of {whole * 1000:.2f} ms (without --step-time)",
            flush=True,
        )
    if rank == 0:
        digest = weights_digest(model)
        if args.out:
            _save_atomic(model.state_dict(), Path(args.out))
        print(f"final weights sha256 {digest}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
