"""Webhook delivery against real local HTTP servers: payload, retries, dead and slow
endpoints, the queue, dedupe, rate limits and filters."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from fakes import FakeClock
from notify_harness import (  # noqa: F401  (fixtures)
    FAST,
    Receiver,
    _no_proxy,
    dead_url,
    notifier,
    receiver,
    timed,
    wait_until,
)

from trainguard.notify.notifier import Notifier
from trainguard.notify.signing import EVENT_HEADER, SIGNATURE_HEADER, verify
from trainguard.spec.notify_rules import NotifyRule
from trainguard.states import JobState


def test_emit_rejects_unknown_kinds_and_reserved_fields(
    notifier: Callable[..., Notifier],
) -> None:
    n = notifier([])
    with pytest.raises(ValueError, match=r"kind: .* got 'oops'"):
        n.emit("oops", "x")
    with pytest.raises(ValueError, match="fields: 'id'"):
        n.emit("custom_message", "x", id="mine")


# ---------------------------------------------------------------- webhook


def test_webhook_payload_headers_and_signature(
    receiver: Callable[..., Receiver],
    notifier: Callable[..., Notifier],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = receiver()
    monkeypatch.setenv("HOOK_SECRET", "from-env")
    n = notifier(
        [
            NotifyRule(sink="webhook", url=f"{r.url}/a", secret="s3cret", **FAST),
            NotifyRule(sink="webhook", url=f"{r.url}/b", secret_env="HOOK_SECRET", **FAST),
        ],
        clock=FakeClock(1234.5),
    )
    n.emit("state_change", "job failed", state=JobState.FAILED, previous="RUNNING", attempt=2)
    n.close()
    assert n.stats["delivered"] == 2 and n.stats["failed"] == 0
    a, b = sorted(r.hits, key=lambda h: h.path)
    assert a.json == {
        "id": a.json["id"],
        "event": "state_change",
        "job_id": "j-1",
        "job_name": "llama",
        "at_s": 1234.5,
        "text": "job failed",
        "state": "FAILED",
        "previous": "RUNNING",
        "attempt": 2,
    }
    assert len(a.json["id"]) == 32 and a.json["id"] == b.json["id"]  # one event, two rules
    assert a.headers["content-type"] == "application/json"
    assert a.headers[EVENT_HEADER.lower()] == "state_change"
    assert verify("s3cret", a.body, a.headers[SIGNATURE_HEADER.lower()])
    assert not verify("wrong", a.body, a.headers[SIGNATURE_HEADER.lower()])
    assert verify("from-env", b.body, b.headers[SIGNATURE_HEADER.lower()])


def test_no_secret_means_no_signature_header(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    r = receiver()
    n = notifier([NotifyRule(sink="webhook", url=r.url, **FAST)])
    n.emit("restart", "restart 1 of 3", reason="worker-1 exited 137")
    n.close()
    (hit,) = r.hits
    assert SIGNATURE_HEADER.lower() not in hit.headers
    assert hit.json["reason"] == "worker-1 exited 137"


def test_retries_5xx_and_429_with_backoff_then_delivers(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    r = receiver(codes=[503, 429])
    n = notifier([NotifyRule(sink="webhook", url=r.url, retries=3, **FAST)])
    n.emit("hang", "worker-0 made no progress for 600s")
    wait_until(lambda: n.stats["delivered"] == 1)
    assert len(r.hits) == 3
    assert len({h.body for h in r.hits}) == 1  # the same event, byte for byte
    assert n.stats["failed"] == 0


@pytest.mark.parametrize("code", [400, 401, 404, 302])
def test_4xx_and_3xx_are_not_retried(
    code: int,
    receiver: Callable[..., Receiver],
    notifier: Callable[..., Notifier],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.notify")
    r = receiver(codes=[code])
    n = notifier([NotifyRule(sink="webhook", url=r.url, retries=3, **FAST)])
    n.emit("isolation", "node-3 isolated")
    wait_until(lambda: n.stats["failed"] == 1)
    assert len(r.hits) == 1
    assert n.stats["delivered"] == 0
    lines = [rec.getMessage() for rec in caplog.records if "not delivered" in rec.getMessage()]
    assert len(lines) == 1 and f"HTTP {code}" in lines[0] and "1 attempt" in lines[0]


def test_dead_endpoint_never_blocks_the_caller_or_another_rule(
    receiver: Callable[..., Receiver],
    notifier: Callable[..., Notifier],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.notify")
    live = receiver()
    n = notifier(
        [
            NotifyRule(sink="webhook", url=dead_url(), retries=2, **FAST),
            NotifyRule(sink="webhook", url=live.url, **FAST),
        ]
    )
    took = timed(lambda: [n.emit("custom_message", f"step {i}") for i in range(5)])  # type: ignore[func-returns-value]
    assert took < 0.2
    wait_until(lambda: len(live.hits) == 5)
    wait_until(lambda: n.stats["failed"] == 5)
    assert n.stats["delivered"] == 5
    lines = [rec.getMessage() for rec in caplog.records if "not delivered" in rec.getMessage()]
    assert len(lines) == 5  # one line per failed event, not per attempt
    assert "3 attempt(s)" in lines[0] and "Connection" in lines[0]
    assert "127.0.0.1" in lines[0] and "/hook" not in lines[0]  # no paths (tokens) in logs


def test_slow_endpoint_neither_blocks_emit_nor_holds_close(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    slow, live = receiver(delay_s=3), receiver()
    n = notifier(
        [
            NotifyRule(sink="webhook", url=slow.url, timeout_s=0.5, retries=5, **FAST),
            NotifyRule(sink="webhook", url=live.url, **FAST),
        ]
    )
    took = timed(lambda: [n.emit("custom_message", f"m{i}") for i in range(3)])  # type: ignore[func-returns-value]
    assert took < 0.2
    wait_until(lambda: len(live.hits) == 3, timeout_s=2)  # while the slow one still hangs
    wait_until(lambda: len(slow.hits) >= 1)
    took = timed(lambda: n.close(timeout_s=1))
    assert took < 2.5
    assert n.stats["dropped"] == 2  # the two behind the one in flight
    wait_until(lambda: n.stats["failed"] == 1)  # the one in flight stops retrying


def test_full_queue_drops_the_oldest(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    slow = receiver(delay_s=3)
    n = notifier(
        [NotifyRule(sink="webhook", url=slow.url, timeout_s=0.5, retries=0, **FAST)], queue_size=2
    )
    for i in range(10):
        n.emit("custom_message", f"m{i}")
    assert n.stats["dropped"] in (7, 8)  # 8, or 7 if the worker took one before the rest came
    n.close(timeout_s=0.1)


# ---------------------------------------------------------------- dedupe, rate limit, filters


def test_dedupe_suppresses_repeats_then_reports_how_many(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    r, clock = receiver(), FakeClock()
    rule = NotifyRule(sink="webhook", url=r.url, backoff_s=0.05, dedupe_window_s=60)
    n = notifier([rule], clock=clock)
    for _ in range(5):
        n.emit("hang", "worker-1 stuck")
    n.emit("hang", "worker-2 stuck")  # another text is another event
    n.emit("state_change", "state", state="RUNNING", previous="PENDING")
    n.emit("state_change", "state", state="FAILED", previous="RUNNING")  # another state too
    assert n.stats["deduplicated"] == 4
    clock.now += 30
    n.emit("hang", "worker-1 stuck")  # still inside the window
    clock.now += 31
    n.emit("hang", "worker-1 stuck")
    n.close()
    assert n.stats == {
        "delivered": 5,
        "failed": 0,
        "deduplicated": 5,
        "rate_limited": 0,
        "dropped": 0,
    }
    worker1 = [h.json for h in r.hits if h.json["text"] == "worker-1 stuck"]
    assert "repeated" not in worker1[0]
    assert worker1[1]["repeated"] == 5 and worker1[1]["at_s"] == 1061.0


def test_rate_limit_is_a_rolling_minute(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    r, clock = receiver(), FakeClock()
    n = notifier([NotifyRule(sink="webhook", url=r.url, rate_limit_per_min=3, **FAST)], clock=clock)
    for i in range(5):
        n.emit("custom_message", f"a{i}")
    assert n.stats["rate_limited"] == 2
    clock.now += 30
    n.emit("custom_message", "b")
    assert n.stats["rate_limited"] == 3  # the first three are still inside the minute
    clock.now += 31
    n.emit("custom_message", "c0")
    n.emit("custom_message", "c1")
    n.close()
    assert n.stats["rate_limited"] == 3 and n.stats["delivered"] == 5
    assert sorted(h.json["text"] for h in r.hits) == ["a0", "a1", "a2", "c0", "c1"]


def test_events_and_states_filters(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    r = receiver()
    n = notifier(
        [
            NotifyRule(
                sink="webhook", url=f"{r.url}/failed", events=["state_change"], states=["failed"]
            ),
            NotifyRule(sink="webhook", url=f"{r.url}/ops", events=["restart", "custom_message"]),
        ]
    )
    n.emit("state_change", "running", state=JobState.RUNNING, previous=JobState.PENDING)
    n.emit("state_change", "failed", state=JobState.FAILED, previous=JobState.RUNNING)
    n.emit("restart", "restart 1")
    n.emit("custom_message", "hello from step 100")
    n.emit("hang", "worker-0 stuck")
    n.close()
    got = sorted((h.path, h.json["text"]) for h in r.hits)
    assert got == [("/failed", "failed"), ("/ops", "hello from step 100"), ("/ops", "restart 1")]


def test_emit_after_close_is_dropped(notifier: Callable[..., Notifier]) -> None:
    n = notifier([NotifyRule(sink="webhook", url=dead_url())])
    n.close()
    n.close()  # twice is fine
    n.emit("custom_message", "late")
    assert n.stats["dropped"] == 1
