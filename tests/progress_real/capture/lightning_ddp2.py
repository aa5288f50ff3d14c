"""Capture: PyTorch Lightning Trainer, devices=2, strategy="ddp" on CPU (gloo), TQDM progress bar.

One process is started; Lightning's subprocess launcher re-runs this script for rank 1, and both
ranks inherit the same stdout/stderr, so both ranks' output lands in one file.
Lightning 2.6.6 picks RichProgressBar by default when `rich` is importable (it is in the dev venv),
so TQDMProgressBar() is passed explicitly here (the bar is drawn by global rank 0 only).

Tiny LightningModule (2-layer MLP regression), random tensors: 120 samples, batch 4, the
DistributedSampler gives each rank 15 batches per epoch; max_steps=30 (2 epochs), val loop
with limit_val_batches=3.
Run (from this directory):
  /work/main/.venv/bin/python lightning_ddp2.py 2>&1 | cat > ../lightning_ddp2.log   (what ./run_all.sh lightning_ddp2 does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

CASE = "lightning_ddp2"
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
        max_steps=30,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_checkpointing=False,
        limit_val_batches=3,
        **extra,
    )


def main():
    L.seed_everything(0)
    train = DataLoader(data(120, 0), batch_size=4)  # 30 batches per epoch on 1 device; 15 per rank with 2
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
        "world_size": trainer.world_size,
        "notes": (
            "Lightning's bar shows 'Epoch E: ... B/15' where B is the batch index within the epoch, "
            "not global_step; global_step (trainer.global_step, per rank) reaches 30 = 2 epochs x 15 batches "
            "and is never printed. last_loss_full is trainer.progress_bar_metrics['train_loss'] "
            "(full precision), last_loss_printed is that value as printed; the bar shows it formatted by Lightning's Tqdm.format_num "
            "(last_loss_printed_str); last_train_bar_postfix is the train bar's postfix string at the end. "
            "Epochs print 0-based ('Epoch 0', 'Epoch 1'); trainer.current_epoch is 2 after fit ends. "
            "A 'Sanity Checking' bar (0/2) comes first and 'Validation DataLoader 0: N/3' bars appear "
            "at each epoch end. Values are rank 0's (the bar is rank 0's; sync_dist is not used)."
        ),
    }
    if trainer.is_global_zero:
        with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
            json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
