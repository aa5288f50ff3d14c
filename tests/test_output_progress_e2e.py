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
