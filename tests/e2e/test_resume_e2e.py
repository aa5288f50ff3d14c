"""`trainguard resume` and `run --resume`: the same job goes on under a new master."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import TG, alive, child, read_pid, wait_for

from trainguard.records.store import Store

pytestmark = pytest.mark.slow  # real jobs and masters

FOREVER_ON_FIRST_ATTEMPT = ("*:print:attempt {attempt}", "*@0:pidfile:{pids}", "*@0:forever")


def _start(tg: TG, pids: Path, *extra: str) -> int:
    """Start a job whose first attempt runs forever, then SIGKILL its master."""
    actions = [a.replace("{pids}", str(pids)) for a in FOREVER_ON_FIRST_ATTEMPT]
    proc = tg.start("run", "--quiet", "--nproc", "2", *extra, "--", *child(*actions))
    for r in (0, 1):
        wait_for(lambda r=r: read_pid(Path(f"{pids}.{r}")), what=f"rank {r}")  # type: ignore[misc]
    return proc.pid


def _kill_master(tg: TG, pid: int, pids: Path) -> None:
    os.kill(pid, signal.SIGKILL)
    replicas = [read_pid(Path(f"{pids}.{r}")) for r in (0, 1)]
    wait_for(lambda: not any(alive(p) for p in replicas if p), what="replicas gone")


def test_resume_continues_the_same_job_after_the_master_was_killed(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    master = _start(tg, pids)
    _kill_master(tg, master, pids)
    job_id = tg.only_job()["id"]
    assert tg.only_job()["state"] == "INTERRUPTED"

    res = tg("resume", job_id, "--quiet")
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["id"], job["state"], job["attempts"]) == (job_id, "SUCCEEDED", 2)
    assert job["error_message"] is None and job["ended_at_s"] is not None
    states = [t.to_state for t in Store(tg.home).transitions_of(job_id)]
    assert states == ["PENDING", "RUNNING", "INTERRUPTED", "PENDING", "RUNNING", "SUCCEEDED"]
    assert "attempt 1" in Path(job["log_dir"], "attempt-1", "worker-0.log").read_text()
    assert "attempt 0" in Path(job["log_dir"], "attempt-0", "worker-0.log").read_text()


def test_run_resume_is_one_line_that_can_simply_be_run_again(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    _kill_master(tg, _start(tg, pids, "--job-name", "nightly", "--resume"), pids)
    first = tg.only_job()
    actions = [a.replace("{pids}", str(pids)) for a in FOREVER_ON_FIRST_ATTEMPT]
    again = ("run", "--quiet", "--nproc", "2", "--job-name", "nightly", "--resume", "--")
    res = tg(*again, *child(*actions))
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["id"], job["state"], job["attempts"]) == (first["id"], "SUCCEEDED", 2)
    # once it has succeeded, the same line starts the job anew
    res = tg(*again, *child("*:print:a new job"))
    assert res.returncode == 0, res.stderr
    assert len(tg.json("jobs")) == 2


def test_a_cancelled_job_can_be_resumed(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    actions = [a.replace("{pids}", str(pids)) for a in FOREVER_ON_FIRST_ATTEMPT]
    proc = tg.start("run", "--quiet", "--nproc", "2", "--", *child(*actions))
    for r in (0, 1):
        wait_for(lambda r=r: read_pid(Path(f"{pids}.{r}")), what=f"rank {r}")  # type: ignore[misc]
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    res = tg("resume", "child", "--quiet")
    assert res.returncode == 0, res.stderr
    assert tg.only_job()["state"] == "SUCCEEDED"


def test_a_finished_or_unknown_job_cannot_be_resumed(tg: TG) -> None:
    assert tg("run", "--quiet", "--", *child("*:print:hi")).returncode == 0
    res = tg("resume", "child")
    assert res.returncode == 2
    assert "is SUCCEEDED; only an interrupted or cancelled job can be resumed" in res.stderr
    res = tg("resume", "no-such-job")
    assert res.returncode == 2 and "no job with id or name 'no-such-job'" in res.stderr
    assert "Traceback" not in res.stderr


def test_a_killed_master_not_yet_reaped_counts_as_gone() -> None:
    """A zombie runs nothing: a master killed while its parent has not waited for it yet
    is gone (its job is INTERRUPTED), not 'still running'."""
    import subprocess
    import sys

    from trainguard.records.liveness import process_start_ticks

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_start_ticks(proc.pid) is not None
        os.kill(proc.pid, signal.SIGKILL)
        wait_for(lambda: Path(f"/proc/{proc.pid}/stat").read_text().split(") ")[1][0] == "Z")
        assert process_start_ticks(proc.pid) is None  # a zombie until we reap it below
    finally:
        proc.kill()
        proc.wait()
