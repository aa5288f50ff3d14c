"""A small model trained with torchft: replica groups that heal from each other.

Each replica group holds a full copy of the model; torchft's Manager forms a quorum of
the live groups at every step (through the Lighthouse trainguard runs), averages their
gradients, and lets a group that restarted heal its weights from a live peer before it
trains again, so a fault costs that group alone. Within a group of several ranks the
ranks split the batch and average their gradients over an ordinary gloo process group.
Every `--ckpt-every` steps the first group of the quorum also commits a durable
checkpoint (`trainguard.sdk.report`), which a restart of the whole job resumes from.

    trainguard run --framework torchft --groups 3 -- python examples/torchft_train.py
    trainguard run --framework torchft --groups 2 --nproc-per-group 2 -- \\
        python examples/torchft_train.py --steps 200
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

from trainguard import sdk


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, default=0.05, help="extra seconds per step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--ckpt-every", type=int, default=20, help="durable checkpoints (0: none)")
    p.add_argument("--out", help="a folder: each group's rank 0 writes its final weights' hash")
    p.add_argument(
        "--bug-at-step",
        type=int,
        help="demo fault: from this step on, group --bug-group hits a bug (every time)",
    )
    p.add_argument("--bug-group", type=int, default=1)
    p.add_argument(
        "--bug-kind",
        choices=("value", "segv"),
        default="value",
        help="the bug: a ValueError, or a native crash (SIGSEGV) that reads like a fault",
    )
    p.add_argument("--timeout", type=float, default=5.0, help="torchft's collective timeout (s)")
    return p.parse_args()


def main() -> None:
    args = _args()
    group = int(os.environ["REPLICA_GROUP_ID"])
    rank, per = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    timeout = timedelta(seconds=args.timeout)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"group_{group}",
        timeout=timeout,
    )
    resumed = _resume(manager, load_state_dict)
    if per > 1:  # the ranks of this group: an ordinary process group, the job's store
        dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    print(f"group {group} rank {rank}/{per} starts{resumed}", flush=True)
    while (step := manager.current_step()) < args.steps:
        if args.bug_at_step is not None and group == args.bug_group and step >= args.bug_at_step:
            _bug(args.bug_kind, step, group)
        g = torch.Generator().manual_seed(100_000 * step + 100 * group + rank)
        x = torch.randn(64, 32, generator=g)
        y = torch.sin(x.sum(1, keepdim=True))
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        if per > 1:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= per
        opt.step()
        done = manager.current_step()
        print(
            f"step {done} group {group} rank {rank} participants "
            f"{manager.num_participants()} loss {loss.item():.5f} t={time.time():.3f}",
            flush=True,
        )
        committed = args.ckpt_every and done % args.ckpt_every == 0 and done > step
        if committed and rank == 0 and manager.participating_rank() == 0:  # one group's
            _checkpoint(done, loss.item(), state_dict(), manager)
        if args.step_time:
            time.sleep(args.step_time)
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().numpy().tobytes())
    print(
        f"final group {group} rank {rank} step {manager.current_step()} sha "
        f"{digest.hexdigest()[:16]}",
        flush=True,
    )
    if args.out and rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"group-{group}.sha").write_text(digest.hexdigest())
    if per > 1:
        dist.destroy_process_group()
    manager.shutdown(wait=False)


def _bug(kind: str, step: int, group: int) -> None:
    if kind == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    raise ValueError(f"bad batch shape at step {step}: a bug in group {group}'s code")


def _resume(manager: Manager, load: Any) -> str:
    """After a restart of the whole job (every group was down): the durable checkpoint."""
    folder = sdk.get_checkpoint()
    if folder is None:
        return ""
    state = torch.load(Path(folder) / "state.pt", weights_only=True)
    load(state["user"])
    manager.load_state_dict(state["torchft"])
    return f" from checkpoint {Path(folder).name} (step {manager.current_step()})"


def _checkpoint(step: int, loss: float, state: dict[str, Any], manager: Manager) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"user": state, "torchft": manager.state_dict()}, Path(tmp) / "state.pt")
        sdk.report({"step": step, "loss": loss}, checkpoint=tmp)


if __name__ == "__main__":
    main()
