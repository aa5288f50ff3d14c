"""Progress from output, end to end (issue 20): an unmodified DDP script (no SDK call; its
own "step N loss L" lines) under trainguard gets goodput, work lost and a fault injected at
a step, as a script that reports through the SDK would."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT, TG

torch = pytest.importorskip("torch")  # the torch extra; a base install skips this file

pytestmark = pytest.mark.slow

EXAMPLE = str(ROOT / "examples" / "ddp_train.py")


def test_an_unmodified_script_gets_goodput_from_its_output(tg: TG) -> None:
    ckpt = tg.home.parent / "ckpt"
    res = tg(
        "run",
        "--quiet",
        "--job-name",
        "plain",
        "--nproc-per-node",
        "2",
        "--inject",
        "signal:worker-1:SIGKILL@step=60",  # the step is read from rank 0's output
        "--",
        sys.executable,
        EXAMPLE,
        "--steps",
        "150",
        "--step-time",
        "0.01",
        "--ckpt-every",
        "50",
        "--ckpt-dir",
        str(ckpt),
        timeout=240,
    )
    assert res.returncode == 0, res.stderr
    (rec,) = tg.json("records", "plain")
    assert "SIGKILL" in rec["error_message"]
    status = tg.json("status", "plain")
    assert status["progress"]["step"] == 150
    assert status["progress"]["metrics"]["progress_from"] == "keyword"
    assert "loss" in status["progress"]["metrics"]
    g = tg.json("goodput", "plain")
    assert g["has_progress"] and g["productive_s"] > 0
    # killed at step 60 or a little later, resumed from the checkpoint of step 50
    assert g["badput"]["work_lost_s"] > 0
    assert 0 < g["goodput"] < 1


LIGHTNING_SCRIPT = """
import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


g = torch.Generator().manual_seed(0)
x = torch.randn(80, 8, generator=g)
data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)
trainer = L.Trainer(
    max_steps=40, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
    callbacks=[TQDMProgressBar()],
)
trainer.fit(Tiny(), data)
print("global_step", trainer.global_step)
"""


def test_a_real_lightning_fit_is_read_as_it_trains(tg: TG) -> None:
    """The recogniser on live Lightning output (not a capture): its step is global_step."""
    pytest.importorskip("lightning")
    script = tg.home.parent / "fit.py"
    script.write_text(LIGHTNING_SCRIPT)
    res = tg("run", "--quiet", "--job-name", "fit", "--", sys.executable, str(script), timeout=240)
    assert res.returncode == 0, res.stderr
    progress = tg.json("status", "fit")["progress"]
    assert progress["step"] == 40  # 2 epochs of 20 batches: Lightning's global_step
    assert progress["metrics"]["progress_from"] == "lightning"
    assert "train_loss" in progress["metrics"]
    assert tg.json("goodput", "fit")["has_progress"]
