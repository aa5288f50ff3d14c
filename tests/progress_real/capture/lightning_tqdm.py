"""Capture: PyTorch Lightning Trainer with the TQDM progress bar.

Lightning 2.6.6 picks RichProgressBar by default when `rich` is importable (it is in the dev venv),
so TQDMProgressBar() (Lightning's default when rich is absent) is passed explicitly here.

Tiny LightningModule (2-layer MLP regression), random tensors, 30 batches per epoch,
max_steps=60 (so 2 epochs, the epoch changes mid-run), val loop with limit_val_batches=3.
Run (from this directory):
  /work/main/.venv/bin/python lightning_tqdm.py 2>&1 | cat > ../lightning_tqdm.log   (what ./run_all.sh lightning_tqdm does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

CASE = "lightning_tqdm"
HERE = os.path.dirname(os.path.abspath(__file__))


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def make_trainer(**extra):
    return L.Trainer(
        max_steps=60,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=3,
        **extra,
    )


def main():
    L.seed_everything(0)
    train = DataLoader(data(120, 0), batch_size=4)  # 30 batches per epoch
    val = DataLoader(data(40, 1), batch_size=4)
    trainer = make_trainer(callbacks=[L.pytorch.callbacks.TQDMProgressBar()])
    trainer.fit(Tiny(), train, val)

    pb = trainer.progress_bar_callback
    bar_postfix = getattr(getattr(pb, "train_progress_bar", None), "postfix", None)
    pbm = {k: float(v) for k, v in trainer.progress_bar_metrics.items()}
    truth = {
        "steps_total": trainer.global_step,
        "last_step_printed": trainer.global_step,
        "last_loss_printed": float(L.pytorch.callbacks.progress.tqdm_progress.Tqdm.format_num(pbm["train_loss"])),
        "last_loss_printed_str": L.pytorch.callbacks.progress.tqdm_progress.Tqdm.format_num(pbm["train_loss"]),
        "last_loss_full": pbm.get("train_loss"),
        "last_train_bar_postfix": bar_postfix,
        "last_epoch_printed": (trainer.global_step - 1) // trainer.num_training_batches,
        "last_val_loss": pbm.get("val_loss"),
        "final_current_epoch": trainer.current_epoch,
        "batches_per_epoch": trainer.num_training_batches,
        "step_number_in_output": False,
        "lightning_version": L.__version__,
        "notes": (
            "Lightning's bar shows 'Epoch E: ... B/30' where B is the batch index within the epoch, "
            "not global_step; global_step (trainer.global_step) reaches 60 = 2 epochs x 30 batches "
            "and is never printed. last_loss_full is trainer.progress_bar_metrics['train_loss'] "
            "(full precision), last_loss_printed is that value as printed; the bar shows it formatted by Lightning's Tqdm.format_num "
            "(last_loss_printed_str); last_train_bar_postfix is the train bar's postfix string at the end. "
            "Epochs print 0-based ('Epoch 0', 'Epoch 1'); trainer.current_epoch is 2 after fit ends. "
            "A 'Sanity Checking' bar (0/2) comes first and 'Validation DataLoader 0: N/3' bars appear "
            "at each epoch end."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
