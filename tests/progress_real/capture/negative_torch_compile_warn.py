"""Negative capture (no training): torch.compile hitting its recompile limit on CPU.

A compiled function is called with a different Python string each time; each new string fails
a guard and triggers a recompile, and after config.recompile_limit (8) torch._dynamo logs its
standard warning, whose lines carry a '[0/8]' frame/compile id (looks like 'N/M' progress).
Run (from this directory):
  /work/main/.venv/bin/python negative_torch_compile_warn.py 2>&1 | cat > ../negative_torch_compile_warn.log   (what ./run_all.sh negative_torch_compile_warn does, with PYTHONUNBUFFERED=1)
"""
import json
import os

import torch

CASE = "negative_torch_compile_warn"
HERE = os.path.dirname(os.path.abspath(__file__))


@torch.compile
def scale(x, tag):
    return x * len(tag)


def main():
    x = torch.randn(4)
    for i in range(12):
        scale(x, f"batch-{i:02d}")
    print("done")
    truth = {
        "steps_total": 0,
        "last_step_printed": None,
        "last_loss_printed": None,
        "torch_version": torch.__version__,
        "notes": (
            "Not training progress. torch._dynamo warning lines start 'W<MMDD> <time> <pid> "
            "torch/_dynamo/convert_frame.py:<line>] [0/8] ...': '[0/8]' is frame 0, compile 8, "
            "and 'recompile_limit (8)' / ':1994]' / 'line N' are not steps."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
