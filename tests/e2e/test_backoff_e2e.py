"""Outages ridden out end to end (issue 38): a real HTTP data service, real replicas.

A replica fetches its data from a local `http.server` at start-up and dies of urllib's
real `HTTPError: HTTP Error 503` while the service is down. The master waits 1, 2, 4 ...
s between attempts, so the job outlasts the outage and succeeds; `explain` shows the
waits. Before issue 38 the second start-up 503 ended the job one second in.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TG
from outage_service import REPLICA, Outage, outage_service

pytestmark = pytest.mark.slow


def _spec(tmp_path: Path, url: str, **fault_tolerance: Any) -> Path:
    script = tmp_path / "fetch.py"
    script.write_text(REPLICA)
    spec = {
        "name": "fetch",
        "worker_pools": [{"command": [sys.executable, str(script), url]}],
        "fault_tolerance": fault_tolerance,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def _gaps(outage: Outage) -> list[float]:
    """Seconds between one request to the service and the next (one request an attempt)."""
    times = [t for t, _ in outage.requests]
    return [b - a for a, b in itertools.pairwise(times)]


def _roots(tg: TG, job_id: str) -> list[dict[str, Any]]:
    return [f for f in tg.json("explain", job_id)["failures"] if f["root_cause"]]


def test_a_service_down_for_6_s_is_ridden_out_with_the_defaults(tg: TG, tmp_path: Path) -> None:
    """The issue's case, with no backoff setting at all: 1 + 2 + 4 s of waits."""
    with outage_service(6.0) as (url, outage):
        res = tg("run", "--quiet", "-f", str(_spec(tmp_path, url)), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    job = tg.only_job()
    codes = [code for _, code in outage.requests]
    # 1 + 2 s of waits, then 4: past the outage (an attempt that started slowly on a busy
    # machine may find the service up one wait sooner)
    assert codes in ([503, 503, 503, 200], [503, 503, 200]), codes
    restarts = len(codes) - 1
    assert (job["state"], job["attempts"], job["restarts"]) == ("SUCCEEDED", restarts + 1, restarts)
    waits = [1.0, 2.0, 4.0][:restarts]
    assert all(gap >= wait for gap, wait in zip(_gaps(outage), waits, strict=True)), _gaps(outage)
    roots = _roots(tg, job["id"])
    assert [f["rule"] for f in roots] == ["remote-5xx"] * restarts
    for f, (wait, step) in zip(roots, [(1, 1), (2, 2), (4, 3)][:restarts], strict=True):
        assert (
            f"a remote service outage: retried in {wait} s (backoff {step} of 7)" in f["decision"]
        )
    text = tg("explain", job["id"]).stdout
    assert "retried in 2 s (backoff 2 of 7)" in text and "ridden out" in text
    rows = tg.json("records", job["id"])
    assert [r["schedule_ms"] for r in rows] == [1000.0, 2000.0, 4000.0][:restarts]


def test_a_service_down_for_10_s_is_ridden_out(tg: TG, tmp_path: Path) -> None:
    """The issue's fault matrix row: 503 for 10 s then 200. Waits of 2, 4, 8 s (the
    default 1 s start reaches 7 s within the default 3 restarts)."""
    with outage_service(10.0) as (url, outage):
        spec = _spec(tmp_path, url, transient_backoff_s=2)
        res = tg("run", "--quiet", "-f", str(spec), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    job = tg.only_job()
    codes = [code for _, code in outage.requests]
    assert codes in ([503, 503, 503, 200], [503, 503, 200]), codes  # 2 + 4 s, then 8
    restarts = len(codes) - 1
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", restarts + 1), job
    waits = [(2, 1), (4, 2), (8, 3)][:restarts]
    assert all(gap >= wait for gap, (wait, _) in zip(_gaps(outage), waits, strict=True))
    text = tg("explain", job["id"]).stdout
    for wait, step in waits:
        assert f"retried in {wait} s (backoff {step} of 6)" in text


def test_without_backoff_the_job_ends_and_its_message_names_the_proof(
    tg: TG, tmp_path: Path
) -> None:
    """Backoff off: today's behaviour, a recurrence at start-up ends the job; the stop
    names its proof in the error message, `status` and `explain`."""
    with outage_service(30.0) as (url, _):
        spec = _spec(tmp_path, url, transient_backoff_s=0)
        res = tg("run", "--quiet", "-f", str(spec), timeout=120)
    assert res.returncode == 1
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 2)
    proof = "the same error in start-up, before any training step in attempts 0 and 1"
    assert job["error_message"] == (
        "The replica worker-0 exited with a non-zero status of 1. Termination reason: "
        f"urllib.error.HTTPError: HTTP Error 503: Service Unavailable. (proof: {proof})"
    )
    status = " ".join(tg("status", job["id"]).stdout.split())  # as wrapped to the terminal
    assert f"(proof: {proof})" in status
    assert f"[proof: {proof}]" in tg("explain", job["id"]).stdout
    assert "Traceback" not in res.stderr.split("last lines of")[0]


def test_a_bad_backoff_in_a_spec_is_one_line(tg: TG, tmp_path: Path) -> None:
    spec = _spec(tmp_path, "http://127.0.0.1:9/", transient_backoff_s=9, transient_backoff_max_s=3)
    res = tg("run", "--quiet", "-f", str(spec))
    assert res.returncode == 2
    assert "transient_backoff_max_s: must be at least transient_backoff_s (9), got 3" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert tg.json("jobs") == []
