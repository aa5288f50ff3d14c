"""Capture: karpathy/nanoGPT's real train.py (not a re-creation), on CPU, random "shakespeare_char" data.

upstream/nanogpt/{train.py,model.py,configurator.py,config/train_shakespeare_char.py} are
byte-for-byte copies from github.com/karpathy/nanoGPT (commit 3adf61e154c3fe3fca428ad6bc3818b27a3b8291,
see SOURCES.md). The command line is the README's CPU ("macbook") example with fewer iterations:
  train.py config/train_shakespeare_char.py --device=cpu --compile=False --eval_iters=20
    --log_interval=1 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
    --max_iters=60 --lr_decay_iters=60 --dropout=0.0 --eval_interval=20
The Shakespeare text is not available (no internet), so data/shakespeare_char/{train,val}.bin are
random uint16 tokens < 65 and meta.pkl has vocab_size 65 (same layout as its prepare.py writes),
created in a scratch working directory /tmp/cap_nanogpt (train.py reads data/ and writes its
checkpoint out-shakespeare-char/ relative to the cwd).
This runner executes train.py with runpy as __main__; it wraps builtins.print only to record the
lines (output unchanged) and counts optimizer steps with a global optimizer step hook.
Run (from this directory):
  /work/main/.venv/bin/python nanogpt_style.py 2>&1 | cat > ../nanogpt_style.log   (what ./run_all.sh nanogpt_style does, with PYTHONUNBUFFERED=1)
"""
import builtins
import json
import os
import pickle
import runpy
import shutil
import sys

import numpy as np
from torch.optim.optimizer import register_optimizer_step_post_hook

CASE = "nanogpt_style"
HERE = os.path.dirname(os.path.abspath(__file__))
UP = os.path.join(HERE, "upstream", "nanogpt")
WORK = "/tmp/cap_nanogpt"
ARGS = [
    "config/train_shakespeare_char.py", "--device=cpu", "--compile=False", "--eval_iters=20",
    "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4",
    "--n_embd=128", "--max_iters=60", "--lr_decay_iters=60", "--dropout=0.0", "--eval_interval=20",
]


def prepare_workdir():
    shutil.rmtree(WORK, ignore_errors=True)
    d = os.path.join(WORK, "data", "shakespeare_char")
    os.makedirs(d)
    os.makedirs(os.path.join(WORK, "config"))
    shutil.copy(os.path.join(UP, "configurator.py"), WORK)
    shutil.copy(os.path.join(UP, "config", "train_shakespeare_char.py"), os.path.join(WORK, "config"))
    rng = np.random.default_rng(0)
    rng.integers(0, 65, 100_000, dtype=np.uint16).tofile(os.path.join(d, "train.bin"))
    rng.integers(0, 65, 10_000, dtype=np.uint16).tofile(os.path.join(d, "val.bin"))
    chars = [chr(32 + i) for i in range(65)]
    meta = {"vocab_size": 65, "itos": dict(enumerate(chars)), "stoi": {c: i for i, c in enumerate(chars)}}
    with open(os.path.join(d, "meta.pkl"), "wb") as f:
        pickle.dump(meta, f)


def main():
    prepare_workdir()
    os.chdir(WORK)
    sys.path.insert(0, UP)  # `from model import GPTConfig, GPT`
    sys.argv = ["train.py"] + ARGS

    steps = {"n": 0}
    register_optimizer_step_post_hook(lambda opt, a, k: steps.__setitem__("n", steps["n"] + 1))
    iter_lines, eval_lines = [], []
    real_print = builtins.print

    def recording_print(*a, **k):
        if a and isinstance(a[0], str):
            if a[0].startswith("iter "):
                iter_lines.append(a[0])
            elif a[0].startswith("step "):
                eval_lines.append(a[0])
        return real_print(*a, **k)

    builtins.print = recording_print
    try:
        g = runpy.run_path(os.path.join(UP, "train.py"), run_name="__main__")
    finally:
        builtins.print = real_print

    last = iter_lines[-1]  # 'iter 60: loss 4.1234, time 12.34ms, mfu 0.01%'
    last_iter = int(last.split(":")[0].split()[1])
    loss_s = last.split("loss ")[1].split(",")[0]
    assert loss_s == f"{g['lossf']:.4f}"
    truth = {
        "steps_total": steps["n"],
        "last_step_printed": last_iter,
        "final_iter_num": g["iter_num"],
        "max_iters": g["max_iters"],
        "last_loss_printed": float(loss_s),
        "last_loss_printed_str": loss_s,
        "last_eval_line": eval_lines[-1],
        "last_val_loss_printed": float(f"{float(g['losses']['val']):.4f}"),
        "eval_steps_printed": [int(s.split(":")[0].split()[1]) for s in eval_lines],
        "iter_lines_printed": len(iter_lines),
        "args": ARGS,
        "step_number_in_output": True,
        "notes": (
            "Real nanoGPT train.py. Iterations are numbered from 0 and the loop runs while "
            "iter_num <= max_iters, so max_iters=60 means 61 optimizer steps (iter 0..60) and the "
            "last line is 'iter 60: ...'; train.py's iter_num is 61 after the loop. 'step N: train "
            "loss X, val loss Y' eval lines come at iter 0, 20, 40, 60, before that iteration's "
            "training step. mfu is -100.00% until local_iter_num >= 5 (running_mfu starts at -1.0). "
            "'saving checkpoint to out-shakespeare-char' appears after an eval when val loss improved."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
