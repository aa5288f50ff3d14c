"""A cancel in the second after the server admits a job (issue 37): the job row never
names the server as its master, so the cancel waits for the master instead of stopping
the server, and the master applies it as it comes up."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TG, wait_for
from test_server import Server, gated

from trainguard.records.control import HELD_CANCEL, claim_master, request_cancel
from trainguard.records.liveness import reap_interrupted, starter_identity
from trainguard.records.schema import jobs
from trainguard.records.store import Store
from trainguard.states import JobState

SLOW_START = """\
import os, sys, time
if "_master" in sys.orig_argv:
    time.sleep(float(os.environ.get("TG_TEST_MASTER_DELAY_S", "0")))
    if os.environ.get("TG_TEST_MASTER_EXIT"):
        os._exit(int(os.environ["TG_TEST_MASTER_EXIT"]))
"""
"""A master that takes its time to start (as on a loaded machine), or dies starting."""


@pytest.fixture
def servers(tg: TG) -> Iterator[Callable[[], Server]]:
    made: list[Server] = []

    def make() -> Server:
        made.append(Server(tg).start())
        return made[-1]

    yield make
    for srv in made:
        srv.stop()


def _slow_masters(tg: TG, tmp_path: Path, delay_s: float, exit_status: int | None = None) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_START)
    tg.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), tg.env.get("PYTHONPATH")]))
    tg.env["TG_TEST_MASTER_DELAY_S"] = str(delay_s)
    if exit_status is not None:
        tg.env["TG_TEST_MASTER_EXIT"] = str(exit_status)


def _admitted(srv: Server, job_id: str) -> dict[str, Any]:
    job: dict[str, Any] = wait_for(
        lambda: (j := srv.http("GET", f"/api/jobs/{job_id}")[1])["state"] != "QUEUED" and j,
        30,
        "the job to be admitted",
    )
    return job


@pytest.mark.slow
@pytest.mark.parametrize("via", ["api", "cli"])
def test_a_cancel_before_the_master_is_up_waits_for_it_and_the_server_lives(
    via: str, tg: TG, tmp_path: Path, servers: Any
) -> None:
    _slow_masters(tg, tmp_path, delay_s=3)
    srv = servers()
    job_id = srv.submit(*gated(tmp_path / "never"))
    job = _admitted(srv, job_id)
    assert job["state"] == "PENDING"
    if via == "api":
        srv.http("POST", f"/api/jobs/{job_id}/cancel", {})
    else:
        res = srv.cli("cancel", job_id)
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == f"job {job_id} CANCELLED"
    srv.wait_state(job_id, "CANCELLED", "SUCCEEDED", "FAILED", "INTERRUPTED")
    assert srv.proc is not None and srv.proc.poll() is None, "the cancel stopped the server"
    assert job["master_pid"] is None  # while the master starts: never the server's pid
    done = srv.json("status", job_id)
    assert done["state"] == "CANCELLED", done
    reasons = [
        t["reason"] for t in srv.http("GET", f"/api/jobs/{job_id}/history")[1]["transitions"]
    ]
    assert f"cancelled ({HELD_CANCEL})" in reasons or HELD_CANCEL in reasons, reasons
    assert srv.state(srv.submit(*gated(tmp_path / "never"))) in ("QUEUED", "PENDING", "RUNNING")


@pytest.mark.slow
def test_a_master_that_dies_before_it_is_up_fails_its_job(
    tg: TG, tmp_path: Path, servers: Any
) -> None:
    _slow_masters(tg, tmp_path, delay_s=0, exit_status=3)
    srv = servers()
    job_id = srv.submit(*gated(tmp_path / "never"))
    assert srv.wait_state(job_id, "FAILED", "SUCCEEDED", "CANCELLED", timeout=30) == "FAILED"
    assert "exited (status 3) before it was up" in srv.json("status", job_id)["error_message"]


# ------------------------------------------------------------------ the rules, on a real store


def _pending(store: Store, **values: Any) -> str:
    store.insert(
        jobs,
        id="j",
        name="n",
        spec_json="{}",
        state=JobState.PENDING.value,
        created_at_s=time.time(),
        attempts=0,
        log_dir="/tmp",
        origin="server",
        **values,
    )
    return "j"


def test_a_cancel_held_before_the_master_is_up_reaches_it_when_it_claims(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job_id = _pending(store, **starter_identity())  # this test process is "the server"
    message = request_cancel(store, store.job(job_id))  # no signal: this process lives on
    assert "its master applies it" in message
    assert store.job(job_id).state == "PENDING"
    assert claim_master(store, job_id) == HELD_CANCEL
    assert store.job(job_id).master_pid == os.getpid()


def test_a_master_claims_only_an_admitted_job(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job_id = _pending(store, **starter_identity())
    assert claim_master(store, job_id) is None  # nothing held
    store.update_job(job_id, state="CANCELLED")
    with pytest.raises(Exception, match="not admitted"):
        claim_master(store, job_id)


def test_a_held_cancel_whose_server_died_ends_cancelled_not_interrupted(tmp_path: Path) -> None:
    store = Store(tmp_path)
    dead = {"starter_pid": 2**22 + 7, "starter_host": socket.gethostname()}  # no such pid
    job_id = _pending(store, starter_started_ticks=1, cancel_requested_at_s=1.0, **dead)
    assert reap_interrupted(store) == [job_id]
    job = store.job(job_id)
    assert (job.state, job.error_code) == ("CANCELLED", "CANCELLED")


def test_an_admitted_job_whose_server_died_is_interrupted(tmp_path: Path) -> None:
    store = Store(tmp_path)
    dead = {"starter_pid": 2**22 + 7, "starter_host": socket.gethostname()}
    job_id = _pending(store, starter_started_ticks=1, **dead)
    assert reap_interrupted(store) == [job_id]
    assert store.job(job_id).state == "INTERRUPTED"
