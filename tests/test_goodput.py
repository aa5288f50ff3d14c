"""Goodput: productive time and badput by category, from a job's rows; Young's advice."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TG
from fakes import job_row

from trainguard.records.goodput import goodput


def test_a_job_killed_once_table() -> None:
    # attempt 0: starts at 0, steps 1..5 at t=2..6, killed at t=6.5 (decided at 6.6)
    # attempt 1: starts at 7, resumes from step 4: steps 4..10 at t=9..15; job ends at 16
    job = job_row(created_at_s=0.0, ended_at_s=16.0)
    attempts = [{"number": 0, "started_at_s": 0.0}, {"number": 1, "started_at_s": 7.0}]
    steps: list[dict[str, object]] = [
        {"attempt": 0, "step": s, "at_s": 1.0 + s, "checkpoint": None} for s in range(1, 6)
    ]
    steps += [{"attempt": 1, "step": s, "at_s": 5.0 + s, "checkpoint": None} for s in range(4, 11)]
    steps[3]["checkpoint"], steps[3]["commit_ms"] = "checkpoint_000001", 500.0
    restarts = [{"at_s": 6.6, "stop_ms": 100.0, "schedule_ms": 0.0, "start_ms": 300.0}]
    g = goodput(job, attempts, restarts, steps, now_s=99.0)
    assert g["total_s"] == 16.0
    assert g["badput"]["startup_s"] == pytest.approx(2.0 + 2.0)
    # attempt 1 redid steps 4 and 5 (t=9..10) before passing step 5
    assert g["badput"]["work_lost_s"] == pytest.approx(2.0)
    assert g["productive_s"] == pytest.approx(4.0 + (6.0 - 2.0))
    assert g["badput"]["detection_s"] == pytest.approx(0.6)
    assert g["badput"]["restart_s"] == pytest.approx(0.4)
    assert sum(g["badput"].values()) + g["productive_s"] == pytest.approx(16.0)
    advice = g["advice"]
    assert advice["young_interval_s"] == pytest.approx(math.sqrt(2 * 0.5 * 16.0))
    assert advice["text"].startswith("checkpoint every 4 s")


def test_a_hang_counts_as_hang_waiting() -> None:
    job = job_row(created_at_s=0.0, ended_at_s=20.0)
    attempts = [{"number": 0, "started_at_s": 0.0}, {"number": 1, "started_at_s": 12.0}]
    steps = [{"attempt": 0, "step": 1, "at_s": 1.0}, {"attempt": 0, "step": 2, "at_s": 2.0}]
    steps += [{"attempt": 1, "step": 3, "at_s": 14.0}, {"attempt": 1, "step": 4, "at_s": 15.0}]
    restarts = [
        {"at_s": 11.0, "failure_class": "hang", "stop_ms": 0, "schedule_ms": 0, "start_ms": 0}
    ]
    g = goodput(job, attempts, restarts, steps, now_s=20.0)
    assert g["badput"]["hang_waiting_s"] == pytest.approx(9.0)
    assert g["badput"]["detection_s"] == 0.0


def test_no_failures_no_advice() -> None:
    job = job_row(created_at_s=0.0, ended_at_s=3.0)
    g = goodput(job, [{"number": 0, "started_at_s": 0.0}], [], [], now_s=3.0)
    assert g["productive_s"] == 0 and g["advice"]["text"] == "no advice: no failures yet"


def test_goodput_of_a_real_job(tg: TG, tmp_path: Path) -> None:
    script = str(ROOT / "tests" / "bins" / "sdk_train.py")
    inject = ("--inject", "signal:worker-0:SIGKILL@step=10")
    res = tg(
        "run",
        "--quiet",
        "--nproc",
        "2",
        *inject,
        "--",
        sys.executable,
        script,
        "25",
        str(tmp_path / "r"),
    )
    assert res.returncode == 0, res.stderr
    g = tg.json("goodput", "sdk_train")
    assert g["failures"] == 1
    assert sum(g["badput"].values()) + g["productive_s"] == pytest.approx(g["total_s"])
    assert 0.3 < g["goodput"] < 1.0
    # checkpoints at every step: little or nothing is redone (the table test covers it)
    assert g["badput"]["work_lost_s"] >= 0 and g["advice"]["young_interval_s"] is not None
    text = tg("goodput", "sdk_train").stdout
    assert "productive" in text and "advice: checkpoint every" in text
    assert json.loads(json.dumps(g)) == g


def test_time_in_the_servers_queue_is_queueing() -> None:
    from trainguard.records.goodput import goodput

    job = job_row(created_at_s=0.0, ended_at_s=10.0)
    moves = [
        {"to_state": "QUEUED", "at_s": 0.0},
        {"to_state": "PENDING", "at_s": 3.0},
        {"to_state": "RUNNING", "at_s": 3.5},
        {"to_state": "QUEUED", "at_s": 5.0},  # requeued to resume
        {"to_state": "PENDING", "at_s": 6.0},
        {"to_state": "SUCCEEDED", "at_s": 10.0},
    ]
    g = goodput(job, [], [], [], 10.0, moves)
    assert g["badput"]["queueing_s"] == 4.0
