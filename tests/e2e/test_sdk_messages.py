"""SDK custom messages are bounded per job (issue 37): their rate at the master's channel,
the number kept in the store, the log line, and a page of them per `GET /history`.
Unbounded, 50,000 messages grew the store by 210 MB and one /history answer to 206 MB."""

from __future__ import annotations

import http.client
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import TG
from sdk_harness import (  # noqa: F401  (fixtures)
    Master,
    clean_sdk,
    loop,
    master,
)
from test_server import Server

from trainguard.master.sdk_wire import MESSAGE_BURST, MESSAGE_RATE_PER_S, RateBucket
from trainguard.records.schema import KEPT_CUSTOM_MESSAGES, jobs
from trainguard.records.store import Store

# ------------------------------------------------------------------ the rules


def test_the_bucket_lets_a_burst_through_then_the_rate() -> None:
    bucket = RateBucket(rate_per_s=2.0, burst=3)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.take(0.4) is False  # 0.8 of a token
    assert bucket.take(0.5) is True
    assert [bucket.take(100.0) for _ in range(4)] == [True, True, True, False]  # never > burst


def test_the_channel_refuses_messages_over_the_rate_with_429(master: Master) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", master.server.port, timeout=10)
    headers = {"Authorization": f"Bearer {master.token}", "Content-Type": "application/json"}
    statuses = []
    for i in range(MESSAGE_BURST + 20):
        body = json.dumps({"replica": "w", "text": f"m{i}"})
        conn.request("POST", "/v1/message", body, headers)
        resp = conn.getresponse()
        statuses.append((resp.status, json.loads(resp.read())))
    conn.close()
    refused = [answer for status, answer in statuses if status == 429]
    assert refused and "custom messages a second" in str(refused[0]["error"])
    delivered = [c for c in master.recorder.calls if c[0] == "message"]
    assert MESSAGE_BURST <= len(delivered) <= MESSAGE_BURST + 5  # 20 requests take < 1 s
    assert len(delivered) + len(refused) == MESSAGE_BURST + 20


def _job(store: Store) -> str:
    store.insert(
        jobs, id="j", name="n", spec_json="{}", state="RUNNING", created_at_s=0.0, log_dir="/x"
    )
    return "j"


def test_the_store_keeps_the_newest_messages_of_a_job(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job_id = _job(store)
    store.insert_event(job_id, 0.0, None, "decision", "kept: another kind")
    for i in range(10):
        store.insert_event(job_id, float(i), "w", "custom_message", f"m{i}", keep=4)
    texts = [e.text for e in store.events_of(job_id)]
    assert texts == ["kept: another kind", "m6", "m7", "m8", "m9"]


def test_events_come_in_pages_newest_first(tmp_path: Path) -> None:
    store = Store(tmp_path)
    job_id = _job(store)
    ids = [store.insert_event(job_id, float(i), "w", "custom_message", f"m{i}") for i in range(10)]
    page, more = store.events_page(job_id, 3)
    assert [e.text for e in page] == ["m7", "m8", "m9"] and more
    page, more = store.events_page(job_id, 3, before=page[0].id)
    assert [e.text for e in page] == ["m4", "m5", "m6"] and more
    page, more = store.events_page(job_id, 3, after=ids[8])
    assert [e.text for e in page] == ["m9"] and not more
    page, more = store.events_page(job_id, 3, after=ids[2], before=ids[6])
    assert [e.text for e in page] == ["m3", "m4", "m5"] and not more


# ------------------------------------------------------------------ a real job

SENDER = """\
import time
from trainguard import sdk
start = time.monotonic()
sent = delivered = 0
while sent < {count}:
    delivered += bool(sdk.send_custom_message("x" * 3990 + str(sent)))
    sent += 1
print(f"sent {{sent}} delivered {{delivered}} in {{time.monotonic() - start:.1f}} s", flush=True)
"""


@pytest.mark.slow
def test_a_job_that_floods_messages_is_bounded_everywhere(tg: TG, tmp_path: Path) -> None:
    script = tmp_path / "flood.py"
    script.write_text(SENDER.format(count=3000))
    srv = Server(tg).start()
    try:
        job_id = srv.submit("--", sys.executable, str(script))
        srv.wait_state(job_id, "SUCCEEDED", "FAILED", timeout=120)
        assert srv.state(job_id) == "SUCCEEDED"
        log = srv.http("GET", f"/api/jobs/{job_id}/logs")[1]["text"].splitlines()
        said = next(line for line in log if line.startswith("sent "))
        seconds = float(said.split()[-2])
        # bounded at the channel: a burst, then the rate (slack for a busy machine)
        most = MESSAGE_BURST + MESSAGE_RATE_PER_S * (seconds + 2)
        history = _history(srv, job_id, limit=50)
        assert len(history["events"]) == 50 and history["events_more"]
        assert len(_history(srv, job_id)["events"]) <= 200  # the default page
        stored = _all_messages(srv, job_id)
        assert MESSAGE_BURST <= len(stored) <= min(most, KEPT_CUSTOM_MESSAGES), (said, len(stored))
        master_log = tg.home / "jobs" / job_id / "master.log"
        assert master_log.stat().st_size < 1024 * 1024  # 3,000 full lines would be 12 MB
        newer = _history(srv, job_id, after=history["events"][-1]["id"])
        assert newer["events"] == [] and not newer["events_more"]
    finally:
        srv.stop()
    assert (tg.home / "trainguard.db").stat().st_size < 16 * 1024 * 1024


def _history(srv: Server, job_id: str, **query: Any) -> dict[str, Any]:
    args = "&".join(f"{k}={v}" for k, v in query.items())
    status, answer = srv.http("GET", f"/api/jobs/{job_id}/history?{args}")
    assert status == 200
    return dict(answer)


def _all_messages(srv: Server, job_id: str) -> list[dict[str, Any]]:
    """Every custom message, page by page, newest page first (as a reader goes back)."""
    found: list[dict[str, Any]] = []
    query: dict[str, Any] = {"limit": 1000}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        page = _history(srv, job_id, **query)
        found = [e for e in page["events"] if e["kind"] == "custom_message"] + found
        if not page["events_more"]:
            return found
        query["before"] = page["events"][0]["id"]
    raise AssertionError("paging /history did not end")
