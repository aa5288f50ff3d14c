"""Capture: plain PyTorch loop wrapped in tqdm, loss shown with set_postfix.

    bar = tqdm(range(80))
    for step in bar: ... bar.set_postfix(loss=loss.item())

Run (from this directory):
  /work/main/.venv/bin/python tqdm_plain.py 2>&1 | cat > ../tqdm_plain.log   (what ./run_all.sh tqdm_plain does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import time

import torch
import tqdm as tqdm_mod
from tqdm import tqdm

CASE = "tqdm_plain"
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(256, 8)
    y = x.sum(dim=1, keepdim=True)
    steps = 0
    bar = tqdm(range(80))
    for step in bar:
        i = (step * 4) % 256
        loss = torch.nn.functional.mse_loss(model(x[i:i + 4]), y[i:i + 4])
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        last_loss = loss.item()
        time.sleep(0.12)  # a step of a real model takes longer than tqdm's 0.1 s mininterval
        bar.set_postfix(loss=last_loss)
    last_n = bar.n
    postfix = bar.postfix
    bar.close()
    truth = {
        "steps_total": steps,
        "last_step_printed": last_n,
        "last_loop_index": step,
        "last_loss_printed": float(tqdm.format_num(last_loss)),
        "last_loss_printed_str": tqdm.format_num(last_loss),
        "last_loss_full": last_loss,
        "last_bar_postfix": postfix,
        "tqdm_version": tqdm_mod.__version__,
        "step_number_in_output": True,
        "notes": (
            "The bar prints the completed count 'N/80' (1-based: the last is 80/80) while the loop "
            "variable `step` ends at 79. Each step sleeps 0.12 s (> tqdm's 0.1 s mininterval) so the "
            "count advances on every redraw; set_postfix also redraws with the count tqdm last synced. The loss is shown by "
            "tqdm.format_num ('{:.3g}', shorter of that and repr) as 'loss=...'."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
