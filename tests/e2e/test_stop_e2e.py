"""Stopping a running job with real processes: a kill from outside, Ctrl+C (once, and a
second time without the grace), `trainguard cancel` from another terminal, a killed
master, and a replica that ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TG, alive, child, read_pid, wait_for
from test_local_e2e import run

from trainguard.records.store import Store

pytestmark = pytest.mark.slow  # real jobs


def test_a_replica_that_ignores_sigterm_is_killed_after_the_grace_period(tg: TG) -> None:
    rc, _ = run(
        tg,
        "--stop-grace-period",
        "1",
        actions=("1:trap-term", "1:print:trapped", "0:sleep:0.5", "1:forever"),
    )
    assert rc == 0
    job = tg.only_job()
    r1 = next(r for r in job["replicas"] if r["name"] == "worker-1")
    assert (r1["state"], r1["signal"], r1["exit_code"]) == ("STOPPED", "SIGKILL", 137)
    assert r1["ended_at_s"] - job["replicas"][0]["ended_at_s"] >= 0.9  # the grace was given
    log = Path(r1["log_path"]).read_text()
    assert "ignoring SIGTERM" in log


def _start_forever(tg: TG, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        *extra,
        "--",
        *child(
            f"*:pidfile:{pids}",
            "*:print:ready {rank} {attempt}",
            f"*:spawn-child:{pids}",
            "*:forever",
        ),
    )
    for r in (0, 1):
        wait_for(lambda r=r: read_pid(Path(f"{pids}.{r}.child")), what=f"rank {r} to start")  # type: ignore[misc]
    return proc, pids


def _pids(pids: Path) -> list[int]:
    out = []
    for r in (0, 1):
        for suffix in ("", ".child"):
            pid = read_pid(Path(f"{pids}.{r}{suffix}"))
            assert pid is not None
            out.append(pid)
    return out


def test_external_kill_restarts_the_job_with_a_fresh_port(tg: TG, tmp_path: Path) -> None:
    proc, pids = _start_forever(tg, tmp_path, "--max-restarts", "1")
    first = _pids(pids)
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]
    port0 = tg.json("status", job_id)["replicas"]
    killed_at = time.time()
    os.kill(first[2], signal.SIGKILL)  # rank 1, from outside trainguard
    wait_for(lambda: tg.json("status", job_id)["attempts"] == 2, what="attempt 2")
    wait_for(lambda: read_pid(Path(f"{pids}.1")) != first[2], what="new rank 1")
    wait_for(lambda: not any(alive(p) for p in first), timeout=15, what="old processes gone")
    records = tg.json("records", job_id)
    assert len(records) == 1 and records[0]["failure_class"] == "preemption"
    assert records[0]["error_source"] == "exit_code"
    # the exit was seen within well under a second of the kill (event driven, no polling)
    store = Store(tg.home)
    runs = store.runs_of(job_id, attempt=0)
    killed = next(r for r in runs if r.replica == "worker-1")
    assert killed.ended_at_s is not None
    seen_ms = (killed.ended_at_s - killed_at) * 1000
    print(f"kill -> exit seen: {seen_ms:.1f} ms")
    assert seen_ms < 1000
    assert next(r for r in runs if r.replica == "worker-0").stop_requested
    ports = {a.master_port for a in store.attempts_of(job_id)}
    assert len(ports) == 2  # a fresh MASTER_PORT for the new attempt
    assert port0
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130


def test_ctrl_c_cancels_cleanly(tg: TG, tmp_path: Path) -> None:
    proc, pids = _start_forever(tg, tmp_path)
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]
    wait_for(lambda: tg.json("status", job_id)["state"] == "RUNNING", what="RUNNING")
    # from another terminal while it runs: status and logs say something useful
    status = tg.json("status", job_id)
    assert [r["state"] for r in status["replicas"]] == ["RUNNING", "RUNNING"]
    assert "ready 1 0" in wait_for(
        lambda: tg("logs", job_id, "--replica", "worker-1").stdout, what="log output"
    )
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    job = tg.json("status", job_id)
    assert job["state"] == "CANCELLED" and job["restarts"] == 0
    states = [t.to_state for t in Store(tg.home).transitions_of(job_id)]
    assert states[-2:] == ["CANCELLING", "CANCELLED"]
    assert not any(alive(p) for p in _pids(pids))


def test_cancel_command_from_another_terminal(tg: TG, tmp_path: Path) -> None:
    proc, pids = _start_forever(tg, tmp_path)
    job_id = wait_for(lambda: tg.json("jobs"), what="the job row")[0]["id"]
    res = tg("cancel", job_id)
    assert res.returncode == 0 and "CANCELLED" in res.stdout
    assert proc.wait(timeout=30) == 130
    assert not any(alive(p) for p in _pids(pids))


def test_master_sigkill_leaves_no_orphan_and_marks_the_job_interrupted(
    tg: TG, tmp_path: Path
) -> None:
    proc, pids = _start_forever(tg, tmp_path)
    everyone = _pids(pids)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    wait_for(lambda: not any(alive(p) for p in everyone), timeout=10, what="replicas to die")
    job = tg.only_job()
    assert job["state"] == "INTERRUPTED"
    assert "interrupted" in job["error_message"]
    assert all(r["ended_at_s"] is not None for r in job["replicas"])


def test_a_second_ctrl_c_stops_without_waiting_for_the_grace(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc",
        "2",
        "--stop-grace-period",
        "60",
        "--",
        *child("*:trap-term", f"*:pidfile:{pids}", "*:forever"),
    )
    for r in (0, 1):
        wait_for(lambda r=r: read_pid(Path(f"{pids}.{r}")), what=f"rank {r}")  # type: ignore[misc]
    job_id = tg.json("jobs")[0]["id"]
    wait_for(lambda: tg.json("status", job_id)["state"] == "RUNNING", what="RUNNING")
    os.kill(proc.pid, signal.SIGINT)
    wait_for(lambda: tg.json("status", job_id)["state"] == "CANCELLING", what="CANCELLING")
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert time.monotonic() - t0 < 30  # not the 60 s grace
    assert tg.json("status", job_id)["state"] == "CANCELLED"
