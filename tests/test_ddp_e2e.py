"""Real PyTorch DDP (gloo, CPU) under trainguard: kill rank 1 mid-run, lose nothing."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TG, wait_for

pytestmark = pytest.mark.slow

EXAMPLE = str(ROOT / "examples" / "ddp_train.py")
ARGS = ("--steps", "80", "--ckpt-every", "10", "--step-time", "0.03")


def _train(tg: TG, ckpt: Path, out: Path) -> list[str]:
    return [
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--",
        sys.executable,
        EXAMPLE,
        *ARGS,
        "--ckpt-dir",
        str(ckpt),
        "--out",
        str(out),
    ]


def _same_weights(a: Path, b: Path) -> bool:
    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigkill_rank1_mid_run_recovers_with_identical_weights(tmp_path: Path) -> None:
    base = TG(tmp_path / "base")
    res = base(*_train(base, tmp_path / "ck-base", tmp_path / "base.pt"), timeout=300)
    assert res.returncode == 0, res.stderr

    tg = TG(tmp_path / "home")
    proc = tg.start(*_train(tg, tmp_path / "ck", tmp_path / "faulty.pt"))
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]

    def rank1_at_step_30() -> int | None:
        replicas = tg.json("status", job_id)["replicas"]
        r1 = next((r for r in replicas if r["name"] == "worker-1"), None)
        if r1 is None or not Path(r1["log_path"]).exists():
            return None
        return r1["pid"] if "step 30 " in Path(r1["log_path"]).read_text() else None

    pid = wait_for(rank1_at_step_30, timeout=120, what="rank 1 to reach step 30")
    os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err

    job = tg.json("status", job_id)
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 2, 1)
    (rec,) = tg.json("records", job_id)
    assert rec["replica"] == "worker-1" and rec["failure_class"] == "preemption"
    # the restarted ranks resumed from a checkpoint instead of from step 0
    log0 = Path(job["replicas"][0]["log_path"]).read_text()
    assert "resumed from step" in log0
    assert _same_weights(tmp_path / "base.pt", tmp_path / "faulty.pt")
    print(f"recovered; restart record phases: { {k: rec[k] for k in rec if k.endswith('_ms')} }")
    assert t_kill > 0


def test_a_bug_on_one_rank_fails_the_job_once_whatever_its_peer_prints(tmp_path: Path) -> None:
    """Rank 1 hits a KeyError; rank 0, mid-allreduce, fails with a gloo connection error.

    The KeyError is the root cause, whichever exit is seen first: no retry is wasted.
    """
    tg = TG(tmp_path / "home")
    argv = _train(tg, tmp_path / "ck", tmp_path / "out.pt")
    res = tg(*argv, "--bug-at-step", "20", timeout=300)
    assert res.returncode == 1, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("FAILED", 1, 0)
    assert "KeyError: 'lr'" in job["error_message"]
    assert job["error_message"].startswith(
        "The replica worker-1 exited with a non-zero status of 1"
    )
    explained = tg.json("explain", job["id"])["failures"]
    root = [f for f in explained if f["root_cause"]]
    assert [(f["replica"], f["failure_class"], f["rule"]) for f in root] == [
        ("worker-1", "user_error", "python-bug")
    ]
    for f in explained:
        if not f["root_cause"]:  # rank 0 failed on its own before it was stopped
            assert (f["cascade_of"], f["retryable"]) == ("worker-1", True)
