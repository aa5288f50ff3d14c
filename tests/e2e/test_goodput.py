"""Goodput: productive time and badput by category, from a job's rows; Young's advice."""

from __future__ import annotations

import itertools
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import ROOT, TG
from fakes import job_row, row

from trainguard.records.goodput import goodput
from trainguard.records.rows import AttemptRow, ProgressRow, RestartRow, TransitionRow
from trainguard.records.store import Store


def _attempt(number: int, started_at_s: float) -> AttemptRow:
    return row(AttemptRow, number=number, started_at_s=started_at_s)


def _step(attempt: int, step: int, at_s: float) -> ProgressRow:
    return row(ProgressRow, attempt=attempt, step=step, at_s=at_s)


def test_a_job_killed_once_table() -> None:
    # attempt 0: starts at 0, steps 1..5 at t=2..6, killed at t=6.5 (decided at 6.6)
    # attempt 1: starts at 7, resumes from step 4: steps 4..10 at t=9..15; job ends at 16
    job = job_row(created_at_s=0.0, ended_at_s=16.0)
    attempts = [_attempt(0, 0.0), _attempt(1, 7.0)]
    steps = [_step(0, s, 1.0 + s) for s in range(1, 6)]
    steps += [_step(1, s, 5.0 + s) for s in range(4, 11)]
    steps[3] = replace(steps[3], checkpoint="checkpoint_000001", commit_ms=500.0)
    restarts = [row(RestartRow, at_s=6.6, stop_ms=100.0, schedule_ms=0.0, start_ms=300.0)]
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
    attempts = [_attempt(0, 0.0), _attempt(1, 12.0)]
    steps = [_step(0, 1, 1.0), _step(0, 2, 2.0), _step(1, 3, 14.0), _step(1, 4, 15.0)]
    restarts = [
        row(RestartRow, at_s=11.0, failure_class="hang", stop_ms=0, schedule_ms=0, start_ms=0)
    ]
    g = goodput(job, attempts, restarts, steps, now_s=20.0)
    assert g["badput"]["hang_waiting_s"] == pytest.approx(9.0)
    assert g["badput"]["detection_s"] == 0.0


def test_no_failures_no_advice() -> None:
    job = job_row(created_at_s=0.0, ended_at_s=3.0)
    g = goodput(job, [_attempt(0, 0.0)], [], [], now_s=3.0)
    assert g["productive_s"] == 0 and g["advice"]["text"] == "no advice: no failures yet"


@pytest.mark.slow
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
    # checkpoints at every step: the work lost is what the kill caught in flight, never the
    # ten steps a resume from scratch would redo. It runs from the last checkpoint to the
    # kill, which the master sends when it reads step 10 in the log: under load that comes
    # a few steps late (0.31 s lost against 0.05-0.09 s steps in a fresh-clone run), so the
    # bound is those ten steps, at the median step time of both attempts.
    firsts: dict[tuple[int, int], float] = {}
    for p in sorted(Store(tg.home).progress_of(g["job"]["id"]), key=lambda p: p.at_s):
        firsts.setdefault((p.attempt, p.step), p.at_s)
    steps = [
        b - a
        for attempt in (0, 1)
        for a, b in itertools.pairwise(sorted(t for (n, _), t in firsts.items() if n == attempt))
    ]
    assert g["badput"]["work_lost_s"] < 10 * statistics.median(steps), (g["badput"], firsts)
    assert g["advice"]["young_interval_s"] is not None
    text = tg("goodput", "sdk_train").stdout
    assert "productive" in text and "advice: checkpoint every" in text


def test_time_in_the_servers_queue_is_queueing() -> None:
    job = job_row(created_at_s=0.0, ended_at_s=10.0)
    moves = [
        row(TransitionRow, to_state=state, at_s=at)
        for state, at in [
            ("QUEUED", 0.0),
            ("PENDING", 3.0),
            ("RUNNING", 3.5),
            ("QUEUED", 5.0),  # requeued to resume
            ("PENDING", 6.0),
            ("SUCCEEDED", 10.0),
        ]
    ]
    g = goodput(job, [], [], [], 10.0, moves)
    assert g["badput"]["queueing_s"] == 4.0
