"""A Ray Train training loop, ported to trainguard by changing its imports and launcher.

With Ray Train:                                 With trainguard:
    from ray import train                           from trainguard import train
    from ray.train import Checkpoint                from trainguard.train import Checkpoint
    TorchTrainer(train_func, scaling_config=        trainguard run --nproc-per-node 2 -- \\
        ScalingConfig(num_workers=2)).fit()             python examples/ray_train_port.py

TorchTrainer sets up the process group; here `init_process_group` reads the torchrun
variables that trainguard sets. Deterministic: a run killed and resumed from its last
checkpoint ends with the weights of a run that never was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainguard import train
from trainguard.train import Checkpoint


def train_func(config: dict[str, int]) -> str:
    ctx = train.get_context()
    rank = ctx.get_world_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["epoch"])
        print(f"rank {rank}: resumed from {checkpoint.path} at epoch {start}", flush=True)
    for epoch in range(start + 1, config["epochs"] + 1):
        gen = torch.Generator().manual_seed(100 * epoch + rank)
        x = torch.randn(32, 16, generator=gen)
        loss = nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True).cos())
        opt.zero_grad()
        loss.backward()
        opt.step()
        metrics = {"epoch": epoch, "step": epoch, "loss": loss.item()}
        if rank == 0:
            with tempfile.TemporaryDirectory() as d:
                state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": epoch}
                torch.save(state, os.path.join(d, "state.pt"))
                train.report(metrics, checkpoint=Checkpoint.from_directory(d))
        else:
            train.report(metrics)
        print(f"epoch {epoch} loss {loss.item():.6f} rank {rank}", flush=True)
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode() + bytes(tensor.contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    digest = train_func({"epochs": args.epochs})
    if dist.get_rank() == 0:
        print(f"final weights sha256 {digest}", flush=True)
    dist.destroy_process_group()
