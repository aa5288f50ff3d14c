"""Capture: nested tqdm bars, outer over epochs, inner over a DataLoader (leave=False).

    for epoch in trange(3):
        for batch in tqdm(loader, leave=False): ...

The inner count restarts from 0 every epoch. Run (from this directory):
  /work/main/.venv/bin/python tqdm_epochs.py 2>&1 | cat > ../tqdm_epochs.log   (what ./run_all.sh tqdm_epochs does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import time

import torch
import tqdm as tqdm_mod
from torch.utils.data import DataLoader, TensorDataset
from tqdm import tqdm, trange

CASE = "tqdm_epochs"
HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(80, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=4)  # 20 batches per epoch
    steps = 0
    outer = trange(3)
    for epoch in outer:
        inner = tqdm(loader, leave=False)
        for xb, yb in inner:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            last_loss = loss.item()
            time.sleep(0.12)  # a step of a real model takes longer than tqdm's 0.1 s mininterval
            inner.set_postfix(loss=last_loss)
        inner_last_n = inner.n
        outer.set_postfix(epoch_loss=last_loss)
    outer_last_n = outer.n
    truth = {
        "steps_total": steps,
        "last_step_printed": steps,
        "last_inner_bar_count": inner_last_n,
        "inner_bar_total": len(loader),
        "last_outer_bar_count": outer_last_n,
        "epochs": 3,
        "last_loss_printed": float(tqdm.format_num(last_loss)),
        "last_loss_printed_str": tqdm.format_num(last_loss),
        "last_loss_full": last_loss,
        "tqdm_version": tqdm_mod.__version__,
        "step_number_in_output": False,
        "notes": (
            "No cumulative step is printed: the inner bar counts batches within the epoch "
            "('N/20', restarting at 0/20 each epoch, cleared at its end since leave=False) and the "
            "outer bar counts epochs ('E/3'). last_step_printed here is the cumulative optimizer "
            "step count (3 x 20 = 60). Both bars write to the same stream; the outer bar's last "
            "postfix is 'epoch_loss=<same value as the last inner loss>'."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
