"""Capture: PyTorch Lightning Trainer with RichProgressBar.

callbacks=[L.pytorch.callbacks.RichProgressBar()] is passed explicitly; note Lightning 2.6.6 also
picks RichProgressBar by default when `rich` is importable (it is in the dev venv).

Tiny LightningModule (2-layer MLP regression), random tensors, 30 batches per epoch,
max_steps=60 (so 2 epochs, the epoch changes mid-run), val loop with limit_val_batches=3.
Run (from this directory):
  /work/main/.venv/bin/python lightning_rich.py 2>&1 | cat > ../lightning_rich.log   (what ./run_all.sh lightning_rich does, with PYTHONUNBUFFERED=1)
"""
import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

CASE = "lightning_rich"
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
    trainer = make_trainer(callbacks=[L.pytorch.callbacks.RichProgressBar()])
    trainer.fit(Tiny(), train, val)

    pbm = {k: float(v) for k, v in trainer.progress_bar_metrics.items()}
    truth = {
        "steps_total": trainer.global_step,
        "last_step_printed": trainer.global_step,
        "last_loss_printed": float(f"{pbm['train_loss']:.3f}"),
        "last_loss_printed_str": f"{pbm['train_loss']:.3f}",
        "last_loss_full": pbm.get("train_loss"),
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
            "(full precision), last_loss_printed is that value as printed; the rich bar prints it as 'train_loss: {:.3f}' (last_loss_printed_str). "
            "With stdout not a terminal, rich's Live display renders NO intermediate updates: the only "
            "progress output is one final render when it stops, after '`Trainer.fit` stopped': "
            "'Epoch 1/-2 ... 30/30 ... train_loss: 0.060' with 'val_loss: ...' wrapped onto the next line; "
            "epoch 0, the sanity-check and the validation bars never appear. The '/-2' is "
            "max_epochs-1 with max_epochs=-1 (only max_steps is set). "
            "Epochs print 0-based ('Epoch 0', 'Epoch 1'); trainer.current_epoch is 2 after fit ends. "
            "Rich model summary table is printed before training."
        ),
    }
    with open(os.path.join(HERE, "..", CASE + ".truth.json"), "w") as f:
        json.dump(truth, f, indent=2)


if __name__ == "__main__":
    main()
