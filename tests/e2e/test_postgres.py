"""The store on PostgreSQL, by URL (R-REC-1): a real server (tests/clusters/postgres.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import TG, child
from postgres import create_database
from sqlalchemy import text

from trainguard.errors import StoreError
from trainguard.records import engine as engine_module
from trainguard.records.schema import (
    attempts,
    events,
    failure_records,
    jobs,
    progress,
    replica_runs,
    restart_records,
)
from trainguard.records.store import Store
from trainguard.states import JobState

pytest.importorskip("psycopg")  # the postgres extra; a base install skips this file

pytestmark = [pytest.mark.slow, pytest.mark.postgres]  # a real PostgreSQL server


@pytest.fixture
def db(postgres_url: str) -> str:
    """A fresh, empty database of the test server: no test sees another's rows."""
    return create_database(postgres_url, f"t_{uuid.uuid4().hex[:12]}")


def test_store_round_trip(db: str, tmp_path: Path) -> None:
    Store(tmp_path, db).close()
    store = Store(tmp_path, db)  # a second open finds the schema there and changes nothing
    at = 1_700_000_000.123456  # seconds since the epoch survive to the microsecond
    store.insert(
        jobs,
        id="tg-1",
        name="train",
        spec_json="{}",
        state=JobState.PENDING,
        created_at_s=at,
        attempts=0,
        log_dir="/logs",
        master_started_ticks=2**40,  # clock ticks since boot pass 2**31 after 248 days
    )
    store.record_transition("tg-1", None, JobState.PENDING, at, "created")
    store.record_transition("tg-1", JobState.PENDING, JobState.RUNNING, at + 1, "started")
    assert store.insert(attempts, job_id="tg-1", number=0, started_at_s=at, master_port=1234) == 0
    run_ids = [
        store.insert(
            replica_runs,
            job_id="tg-1",
            attempt=0,
            replica=f"worker-{rank}",
            rank=rank,
            state="RUNNING",
            started_at_s=at,
        )
        for rank in (0, 1)
    ]
    assert run_ids[0] > 0 and run_ids[1] == run_ids[0] + 1
    store.update_row(
        replica_runs,
        run_ids[1],
        state="FAILED",
        exit_code=139,
        signal="SIGSTKFLT",  # the longest values each bounded column is given
        failure_class="insufficient_capacity",
        rule="transient-signal-SIGSEGV",
        fingerprint="0123456789ab",
        stop_requested=False,
        ended_at_s=at + 2,
        tail="binary output \x00 here",  # PostgreSQL text cannot hold NUL
    )
    store.end_attempt("tg-1", 0, ended_at_s=at + 3, outcome="internal error", reason="x")
    failure_id = store.insert(
        failure_records,
        job_id="tg-1",
        attempt=0,
        replica="worker-1",
        at_s=at + 2,
        exit_code=139,
        signal="SIGSEGV",
        failure_class="transient_exit",
        retryable=True,
        root_cause=True,
        decision="RestartJob: SIGSEGV",
    )
    restart_id = store.insert(
        restart_records,
        job_id="tg-1",
        round=1,
        at_s=at + 2,
        replica="worker-1",
        error_code="SPAWN_ERROR",
        error_source="exit_hang_detector",
        failure_class="transient_exit",
    )
    store.update_row(restart_records, restart_id, detect_ms=1.5, start_ms=20.25)
    store.insert(events, job_id="tg-1", at_s=at, replica="r" * 128, kind="custom_message", text="")
    store.insert(progress, job_id="tg-1", attempt=0, step=2**33, at_s=at)
    store.update_job("tg-1", last_step=2**33)
    assert store.set_state_if("tg-1", "RUNNING", "SUCCEEDED", at + 4, ended_at_s=at + 4)
    assert not store.set_state_if("tg-1", "RUNNING", "FAILED", at + 5)

    job = store.resolve_job("train")
    assert (job.id, job.state, job.attempts, job.ended_at_s) == (
        "tg-1",
        "SUCCEEDED",
        0,
        at + 4,
    )
    assert (job.created_at_s, job.master_started_ticks, job.last_step) == (
        at,
        2**40,
        2**33,
    )
    assert [j.id for j in store.list_jobs()] == ["tg-1"] and store.live_jobs() == []
    assert [(t.from_state, t.to_state) for t in store.transitions_of("tg-1")] == [
        (None, "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    [attempt] = store.attempts_of("tg-1")
    assert (attempt.outcome, attempt.ended_at_s, attempt.master_port) == (
        "internal error",
        at + 3,
        1234,
    )
    runs = store.runs_of("tg-1", attempt=0)
    assert [(r.replica, r.state, r.restart) for r in runs] == [
        ("worker-0", "RUNNING", 0),
        ("worker-1", "FAILED", 0),
    ]
    assert runs[0].stop_requested is False and runs[1].signal == "SIGSTKFLT"
    assert runs[1].tail == "binary output \ufffd here"
    [failure] = store.failures_of("tg-1")
    assert failure.id == failure_id
    assert (failure.retryable, failure.root_cause) == (True, True)
    [restart] = store.restarts_of("tg-1")
    assert (restart.id, restart.detect_ms, restart.start_ms) == (restart_id, 1.5, 20.25)
    assert restart.error_source == "exit_hang_detector"
    assert [e.replica for e in store.events_of("tg-1")] == ["r" * 128]
    assert [p.step for p in store.progress_of("tg-1")] == [2**33]
    assert store.stack_dumps_of("tg-1") == []
    store.close()


def test_a_column_a_newer_trainguard_added_is_added_to_an_old_database(
    db: str, tmp_path: Path
) -> None:
    store = Store(tmp_path, db)
    with store.engine.begin() as conn:
        conn.execute(text('ALTER TABLE jobs DROP COLUMN "last_progress_s"'))
        conn.execute(text('ALTER TABLE restart_records DROP COLUMN "isolated"'))
    store.close()
    store = Store(tmp_path, db)
    row = {"spec_json": "{}", "state": "PENDING", "created_at_s": 1.0, "log_dir": "/l"}
    store.insert(jobs, id="j", name="n", last_progress_s=2.5, **row)
    store.insert(restart_records, job_id="j", round=1, at_s=1.0, isolated="gpu 3")
    assert store.job("j").last_progress_s == 2.5
    assert store.restarts_of("j")[0].isolated == "gpu 3"
    store.close()


def test_a_job_restarts_once_and_succeeds_with_its_records_in_postgres(
    db: str, tmp_path: Path
) -> None:
    tg = TG(tmp_path / "home")
    res = tg(
        "--db",
        db,
        "run",
        "--quiet",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--",
        *child("1@0:signal:SEGV", "*:sleep:0.2"),
    )
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert not (tg.home / "trainguard.db").exists()  # nothing went to a SQLite file
    tg.env["TRAINGUARD_DB"] = db  # the reads find the store through the environment
    [summary] = tg.json("jobs")
    job = tg.json("status", summary["id"])
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", 2, 1)
    [record] = tg.json("records", job["id"])
    assert (record["replica"], record["failure_class"]) == ("worker-1", "transient_exit")
    store = Store(tmp_path, db)
    assert [a.outcome for a in store.attempts_of(job["id"])] == ["restarted", "SUCCEEDED"]
    assert len(store.runs_of(job["id"])) == 4
    store.close()


def test_four_processes_open_a_new_database_at_once(db: str, tmp_path: Path) -> None:
    """Each of three fresh databases is opened by four processes at the same moment."""
    urls = [db, *(create_database(db, f"t_{uuid.uuid4().hex[:12]}") for _ in range(2))]
    start_s = time.time() + 2  # after every interpreter has imported SQLAlchemy
    code = (
        "import sys, time; from pathlib import Path; from trainguard.records.store import Store\n"
        "for i, url in enumerate(sys.argv[2:]):\n"
        f"    time.sleep(max(0.0, {start_s} + 0.5 * i - time.time()))\n"
        "    Store(Path(sys.argv[1]), url).close()\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / f"h{i}"), *urls],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    for url in urls:
        store = Store(tmp_path, url)
        assert store.list_jobs() == []
        store.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_one_clear_line(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://tg:s3cret@127.0.0.1:{_closed_port()}/trainguard"
    t0 = time.monotonic()
    res = TG(tmp_path / "home")("--db", url, "jobs")
    assert time.monotonic() - t0 < 10
    assert res.returncode == StoreError.exit_code
    [line] = res.stderr.splitlines()
    assert line.startswith("trainguard: cannot open the trainguard store at postgresql+psycopg://")
    assert "Connection refused" in line and "s3cret" not in line, line
    assert res.stdout == ""


def test_a_server_that_never_answers_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "CONNECT_TIMEOUT_S", 1)  # the default, made short
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql+psycopg://tg@127.0.0.1:{silent.getsockname()[1]}/trainguard"
        t0 = time.monotonic()
        with pytest.raises(StoreError, match=r"^cannot open the trainguard store at .*timeout"):
            Store(tmp_path, url)
        assert time.monotonic() - t0 < 5


@pytest.mark.slow
def test_the_server_queues_and_runs_jobs_on_postgres(db: str, tg: TG) -> None:
    from test_server import Server

    tg.env["TRAINGUARD_DB"] = db
    srv = Server(tg, "--cpus", "2").start()
    try:
        first = srv.submit("--nproc-per-node", "2", "--", *child("1@0:signal:SIGKILL", "0:sleep:1"))
        second = srv.submit("--nproc-per-node", "2", "--", *child("*:print:two"))
        assert srv.wait_state(first, "SUCCEEDED", "FAILED") == "SUCCEEDED"
        assert srv.wait_state(second, "SUCCEEDED", "FAILED") == "SUCCEEDED"
        assert srv.json("status", first)["restarts"] == 1
        assert not (tg.home / "trainguard.db").exists()  # everything went to PostgreSQL
    finally:
        srv.stop()
