"""Warm start (the default) under frameworks nobody here wrote: a Lightning DDP job and a
Keras job behave as they do cold (issue 16). Slow: each runs twice, importing its framework."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TG
from warm import cold_and_warm, newest_logs

pytestmark = pytest.mark.slow

LIGHTNING = '''
"""Lightning's own demo model (lightning.pytorch.demos), trained with DDP as its docs show."""
import hashlib, os
import lightning as L
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

if __name__ == "__main__":
    L.seed_everything(7)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=12, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.path.dirname(os.path.abspath(__file__)),
    )
    model = BoringModel()
    trainer.fit(model)
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    print("LIT", trainer.global_rank, trainer.world_size, trainer.global_step,
          hashlib.sha256(weights).hexdigest()[:16], flush=True)
    # What PyTorch asks of every script: without it a gloo worker thread can outlive the
    # interpreter and abort the process at exit ("terminate called without an active
    # exception"), seen once in a cold run here.
    torch.distributed.destroy_process_group()
'''

KERAS = """
import hashlib, os
import numpy as np
print("DRAW", np.random.rand(), flush=True)  # unseeded: each process draws its own
import tensorflow as tf

tf.keras.utils.set_random_seed(3)
x = np.random.RandomState(0).rand(64, 4).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(x, x.sum(1), epochs=2, batch_size=16, verbose=0)
weights = b"".join(w.tobytes() for w in model.get_weights())
print("KERAS", os.environ["RANK"], hashlib.sha256(weights).hexdigest()[:16], flush=True)
# the primary's exit ends the job: it waits until the other rank has printed
import pathlib, sys, time
done = pathlib.Path(sys.argv[1]) / os.environ["TRAINGUARD_JOB_ID"]  # one per run
done.with_suffix("." + os.environ["RANK"]).touch()
deadline = time.time() + 120
while os.environ["RANK"] == "0" and time.time() < deadline and not done.with_suffix(".1").exists():
    time.sleep(0.05)
"""


def test_an_unmodified_lightning_ddp_script_runs_the_same_cold_and_warm(
    tg: TG, tmp_path: Path
) -> None:
    """Lightning requires torch: torch is preloaded (Lightning itself is imported by each
    replica, as it reads RANK when imported). Every line of both ranks' logs is the same."""
    pytest.importorskip("lightning")
    script = tmp_path / "lit.py"
    script.write_text(LIGHTNING)
    argv = ("--nproc-per-node", "2", "--", sys.executable, str(script))
    cold, warm = cold_and_warm(tg, *argv, prefix="")
    assert cold == warm
    (r0,), (r1,) = ([x for x in log if x.startswith("LIT ")] for log in cold)
    assert r0.split()[:4] == ["LIT", "0", "2", "12"] and r0.split()[-1] == r1.split()[-1]


def test_a_keras_script_runs_the_same_cold_and_warm(tg: TG, tmp_path: Path) -> None:
    """TensorFlow is not preloaded (it starts threads when imported), numpy is: Keras is
    imported after the fork and trains to the same weights."""
    pytest.importorskip("tensorflow")
    script = tmp_path / "keras_job.py"
    script.write_text(KERAS)
    argv = ("--nproc-per-node", "2", "--", sys.executable, str(script), str(tmp_path))
    cold, warm = cold_and_warm(tg, *argv, prefix="KERAS ", warm_note="warm start: numpy")
    assert cold == warm and len(cold[0]) == 1
    assert cold[0][0].split()[2] == cold[1][0].split()[2]  # DDP-free, same seed: same weights
    draws = [x for log in newest_logs(tg) for x in log.splitlines() if x.startswith("DRAW")]
    assert len(draws) == 2 and draws[0] != draws[1]  # the zygote's numpy state is not shared
