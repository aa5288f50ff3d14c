"""What an in-memory snapshot costs a training step (issue 16), in one process on one thread.

For each model: the median step (forward, backward, optimizer) and the median time the
step spends in `trainguard.sdk.snapshot`'s work (state_dict, pickle of the skeleton, the
copy of every tensor into /dev/shm; the CRC and header are committed by a thread), and,
for comparison, what `torch.save` into /dev/shm plus a CRC cost (how snapshots were made
before). The example's MLP is the worst case: its step is one pass over memory-bound
layers, so a copy of its weights is a large share of it; a transformer's step does far
more work per byte of state.

    .venv/bin/python bench/snapshot_cost.py [--steps 30]
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from trainguard.storage import snapshot_state, snapshots


def _mlp(hidden: int) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    return model, lambda: nn.functional.mse_loss(model(x), y)


def _transformer() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    layer = nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
    x = torch.randn(16, 128, 256)
    return model, lambda: model(x).pow(2).mean()


def _size(state: dict[str, object]) -> int:
    _, _, parts = snapshot_state.parts(state)
    return sum(n for n, _ in parts)


def measure(
    name: str,
    build: Callable[[], tuple[nn.Module, Callable[[], torch.Tensor]]],
    optim: str,
    steps: int,
    root: Path,
) -> None:
    torch.manual_seed(0)
    model, loss_of = build()
    opt: torch.optim.Optimizer = (
        torch.optim.Adam(model.parameters(), lr=1e-4)
        if optim == "adam"
        else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    )
    writer = snapshots.Writer(root, 0)
    step_s: list[float] = []
    snap_s: list[float] = []
    old_s: list[float] = []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_of().backward()
        opt.step()
        t1 = time.perf_counter()
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        form, skeleton, parts = snapshot_state.parts(state)
        writer.write(1, 0, step, parts, form, skeleton)
        t2 = time.perf_counter()
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
        view = buf.getbuffer()
        zlib.crc32(view)
        with tempfile.NamedTemporaryFile(dir=root) as fh:
            fh.write(view)
        del view
        t3 = time.perf_counter()
        if step >= 3:  # the first steps allocate (and the first snapshot faults its pages)
            step_s.append(t1 - t0)
            snap_s.append(t2 - t1)
            old_s.append(t3 - t2)
        writer.wait()
    writer.close()
    size = _size({"model": model.state_dict(), "optim": opt.state_dict()})
    st, sn, old = (statistics.median(v) for v in (step_s, snap_s, old_s))
    print(
        f"{name:<28} state {size / 1e6:7.1f} MB  step {st * 1000:8.2f} ms  "
        f"snapshot {sn * 1000:6.2f} ms = {100 * sn / st:5.1f}% of a step  "
        f"(torch.save + CRC + write: {old * 1000:6.2f} ms = {100 * old / st:5.1f}%)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    torch.set_num_threads(1)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="tg-snapbench-", dir=base))
    try:
        print(f"torch {torch.__version__}, 1 thread, medians over {args.steps - 3} steps")
        measure("MLP hidden 64 (SGD)", lambda: _mlp(64), "sgd", args.steps, root)
        measure("MLP hidden 65536 (SGD)", lambda: _mlp(65536), "sgd", args.steps, root)
        measure("transformer 4x256 (Adam)", _transformer, "adam", args.steps, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
