"""Capture: the real pytorch/examples mnist/main.py, run unmodified, with fake MNIST data.

upstream/pytorch_examples_mnist_main.py is a byte-for-byte copy of mnist/main.py from
github.com/pytorch/examples (commit 77f55b912142e11fcfdf5b530231fb9c52f181e8; see SOURCES.md).
It imports torchvision, which is not installed here and MNIST cannot be downloaded (no internet),
so this runner puts a minimal stand-in `torchvision` module into sys.modules first:
  - datasets.MNIST returns random tensors of MNIST's shape (1x28x28 float, label 0..9),
    1280 train / 200 test samples, already normalised (the transform is ignored);
  - transforms.Compose/ToTensor/Normalize are no-op placeholders.
Everything else (model, Adadelta, StepLR, the train/test loops and their print() calls) is the
upstream code. Args: --epochs 2 --log-interval 5 --no-accel (batch size default 64 -> 20 batches
per epoch, 40 optimizer steps). Run (from this directory):
  /work/main/.venv/bin/python pytorch_examples_mnist.py 2>&1 | cat > ../pytorch_examples_mnist.log   (what ./run_all.sh pytorch_examples_mnist does, with PYTHONUNBUFFERED=1)
"""
import builtins
import importlib.util
import json
import os
import sys
import types

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

CASE = "pytorch_examples_mnist"
HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = ["--epochs", "2", "--log-interval", "5", "--no-accel"]


class FakeMNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, download=False, transform=None):
        n = 1280 if train else 200
        g = torch.Generator().manual_seed(0 if train else 1)
        self.x = torch.randn(n, 1, 28, 28, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def install_fake_torchvision():
    tv = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    datasets.MNIST = FakeMNIST
    transforms.Compose = lambda ts: None
    transforms.ToTensor = lambda: None
    transforms.Normalize = lambda mean, std: None
    tv.datasets, tv.transforms = datasets, transforms
    sys.modules.update({"torchvision": tv, "torchvision.datasets": datasets, "torchvision.transforms": transforms})


def main():
    install_fake_torchvision()
    steps = {"n": 0}
    register_optimizer_step_post_hook(lambda opt, a, k: steps.__setitem__("n", steps["n"] + 1))

    spec = importlib.util.spec_from_file_location("mnist_main", os.path.join(HERE, "upstream", "pytorch_examples_mnist_main.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    # Record the train-progress print() calls (the module's global `print`), unchanged output.
    printed = []

    def recording_print(*a, **k):
        if a and isinstance(a[0], str) and a[0].startswith("Train Epoch:"):
            printed.append((a[0], steps["n"]))
        return builtins.print(*a, **k)

    mod.print = recording_print
    sys.argv = ["main.py"] + ARGS
    mod.main()

    last_line, steps_at_last_print = printed[-1]
    # e.g. 'Train Epoch: 2 [960/1280 (75%)]\tLoss: 2.276665'
    head, loss_s = last_line.split("\tLoss: ")
    epoch_s, rest = head[len("Train Epoch: "):].split(" [")
    samples_s = rest.split("/")[0]
    truth = {
        "steps_total": steps["n"],
        "last_step_printed": steps_at_last_print,
        "last_loss_printed": float(loss_s),
        "last_loss_printed_str": loss_s,
        "last_epoch_printed": int(epoch_s),
        "last_samples_printed": int(samples_s),
        "batches_per_epoch": -(-1280 // 64),
        "train_lines_printed": len(printed),
        "args": ARGS,
        "step_number_in_output": False,
        "notes": (
            "main.py prints 'Train Epoch: E [S/N (P%)]\\tLoss: L' every --log-interval batches, where S = "
            "batch_idx * len(batch) is a SAMPLE count within the epoch (resets each epoch), not a step; "
            "E is 1-based. last_step_printed is the cumulative optimizer step count (counted with a "
            "global optimizer step hook) at the time of the last 'Train Epoch' line (batch_idx 15 of "
            "epoch 2 -> step 36); steps_total counts all optimizer.step() calls. A 'Test set: Average "
            "loss: ...' block follows each epoch; that loss is a test loss, not the train loss."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
