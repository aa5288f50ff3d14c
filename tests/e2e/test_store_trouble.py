"""The master never loses or repeats work because its store is locked: writes are held.

A lock held on the SQLite store longer than its busy timeout (10 s) used to turn the next
write into an internal error, and the internal error into a restart of a job whose
replicas had already finished: the command ran twice. Now the writes wait in memory.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TG, child, wait_for

from trainguard.errors import StoreError
from trainguard.records.recorder import Recorder
from trainguard.records.store import Store
from trainguard.spec.models import validate_spec
from trainguard.states import JobState


class FlakyStore(Store):
    """A real store whose writes fail (as a locked database does) while `locked` is set."""

    locked = False
    batches = 0  # update_rows calls that went through

    def _check(self) -> None:
        if self.locked:
            raise StoreError("trainguard store error: OperationalError: locked", transient=True)

    def update_job(self, job_id: str, **values: object) -> None:
        self._check()
        super().update_job(job_id, **values)

    def insert(self, table: object, **values: object) -> int:
        self._check()
        return super().insert(table, **values)  # type: ignore[arg-type]

    def update_row(self, table: object, row_id: int, **values: object) -> None:
        self._check()
        super().update_row(table, row_id, **values)  # type: ignore[arg-type]

    def update_rows(self, table: object, rows: object) -> None:
        self._check()
        self.batches += 1
        super().update_rows(table, rows)  # type: ignore[arg-type]


def test_held_writes_keep_their_order_and_their_ids(tmp_path: Path) -> None:
    store = FlakyStore(tmp_path / "home")
    rec = Recorder(store, "job-1")
    said: list[str] = []
    rec.say = said.append
    spec = validate_spec({"name": "t", "worker_pools": [{"command": ["x"]}]})
    rec.job_created(name="t", spec=spec, log_dir=tmp_path, at_s=0.0, master={})
    store.locked = True
    run_id = rec.run_started(
        attempt=0, replica="worker-0", rank=0, restart=0, pid=7, log_path=tmp_path / "l", at_s=1.0
    )
    assert run_id < 0 and rec.held == 1  # a placeholder, handed out while the store is locked
    rec.attempt_started(0, 1.0, "127.0.0.1", 1234)
    assert len(said) == 1 and "holding writes in memory" in said[0]
    store.locked = False
    assert rec.flush(force=True) and rec.held == 0
    runs = store.runs_of("job-1", attempt=0)
    assert [(r.replica, r.pid) for r in runs] == [("worker-0", 7)]
    # a later write that names the placeholder reaches the real row
    from trainguard.classify.classes import ExitEvidence
    from trainguard.classify.exits import classify_exit
    from trainguard.states import ReplicaState

    c = classify_exit(ExitEvidence("worker-0", 0))
    rec.run_ended(run_id, 2.0, c, ReplicaState.SUCCEEDED)
    assert store.runs_of("job-1", attempt=0)[0].state == "SUCCEEDED"
    assert store.job("job-1").attempts == 1
    assert "every held write is recorded" in said[-1]


def test_runs_ended_together_are_one_write_and_held_alike_while_the_store_is_locked(
    tmp_path: Path,
) -> None:
    """A stop's exits (`Recorder.ending`): one transaction for all, and with the store
    locked at its end, held and recorded once it takes writes again; nothing lost."""
    from trainguard.classify.classes import ExitEvidence
    from trainguard.classify.exits import classify_exit
    from trainguard.states import ReplicaState

    store = FlakyStore(tmp_path / "home")
    rec = Recorder(store, "job-1")
    rec.say = lambda _text: None
    spec = validate_spec({"name": "t", "worker_pools": [{"command": ["x"], "replicas": 4}]})
    rec.job_created(name="t", spec=spec, log_dir=tmp_path, at_s=0.0, master={})
    ids = [
        rec.run_started(
            attempt=0,
            replica=f"worker-{i}",
            rank=i,
            restart=0,
            pid=i + 1,
            log_path=tmp_path,
            at_s=1.0,
        )
        for i in range(4)
    ]
    stopped = classify_exit(ExitEvidence("worker-0", -15, stop_requested=True))
    with rec.ending():
        for run_id in ids[:2]:
            rec.run_ended(run_id, 2.0, stopped, ReplicaState.STOPPED, ("last line",))
        assert [r.state for r in store.runs_of("job-1")][:2] == ["RUNNING", "RUNNING"]
    assert store.batches == 1
    runs = store.runs_of("job-1")
    assert [r.state for r in runs] == ["STOPPED", "STOPPED", "RUNNING", "RUNNING"]
    assert runs[0].tail == "last line" and runs[1].ended_at_s == 2.0
    store.locked = True
    with rec.ending():
        for run_id in ids[2:]:
            rec.run_ended(run_id, 3.0, stopped, ReplicaState.STOPPED)
    assert rec.held == 1 and store.runs_of("job-1")[3].state == "RUNNING"
    store.locked = False
    assert rec.flush(force=True)
    assert [r.state for r in store.runs_of("job-1")] == ["STOPPED"] * 4


def test_a_permanent_store_error_is_not_held(tmp_path: Path) -> None:
    rec = Recorder(Store(tmp_path / "home"), "no-such-job")
    with pytest.raises(StoreError):
        rec.run_started(
            attempt=0, replica="w", rank=0, restart=0, pid=1, log_path=tmp_path, at_s=0.0
        )  # a foreign key to a job that does not exist: a bug, raised at once


@pytest.mark.slow
def test_a_store_locked_past_its_busy_timeout_runs_the_command_once(tg: TG, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    started = tmp_path / "started"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--",
        *child(f"*:pidfile:{runs}", f"0:pidfile:{started}", "*:sleep:4", "*:print:done"),
    )
    wait_for(lambda: Path(f"{started}.0").exists(), 60, "the replicas to start")
    lock = sqlite3.connect(
        tg.home / "trainguard.db", timeout=30, isolation_level=None, check_same_thread=False
    )
    lock.execute("BEGIN EXCLUSIVE")  # what another process holding the database does
    release = threading.Timer(15.0, lock.rollback)
    release.start()
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=180)
    release.join()
    lock.close()
    assert proc.returncode == 0, err
    assert time.monotonic() - t0 >= 10  # it waited for the store, it did not give up
    assert sorted(p.name for p in tmp_path.glob("runs.*")) == ["runs.0", "runs.1"]
    # each replica ran once: one attempt, no restart, the true final state recorded
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 1, 0)
    assert len(Store(tg.home).runs_of(job["id"])) == 2
    assert "holding writes in memory" in err and "Internal error" not in err
    assert JobState(job["state"]) is JobState.SUCCEEDED


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of our own (root only), unmounted afterwards."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.fail("the full-disk test mounts a tmpfs: it needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_a_full_disk_under_the_state_folder_loses_nothing_once_space_returns(
    tmp_path: Path, small_disk: Path
) -> None:
    tg = TG(small_disk / "home")
    assert tg("jobs").returncode == 0  # the store exists before the disk fills
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(b"\0" * max(0, free - 64 * 1024))  # 64 KiB left
    chatter = "x" * 200
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--",
        sys.executable,
        "-c",
        f"import time\nfor i in range(400):\n    print('{chatter}', i, flush=True)\n"
        "    time.sleep(0.005)\nprint('done', flush=True)\n",
    )
    time.sleep(6)  # the replicas run, print, and end while the disk is full
    filler.unlink()  # space comes back
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err.count("cannot write replica logs") == 1, err  # one warning, not hundreds
    assert "database or disk is full); holding writes in memory" in err
    assert "the store takes writes again; every held write is recorded" in err
    assert "Traceback" not in err
    job = tg.only_job()
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 1, 0)
