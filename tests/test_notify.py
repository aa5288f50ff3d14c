"""Notifications against real local HTTP servers, real child commands and real apprise."""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeClock

from trainguard.notify.notifier import Notifier
from trainguard.notify.signing import EVENT_HEADER, SIGNATURE_HEADER, sign, verify
from trainguard.spec.notify_rules import NotifyRule
from trainguard.states import JobState

FAST = {"backoff_s": 0.05, "dedupe_window_s": 0}  # quick retries, no dedupe unless a test asks


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@dataclass(frozen=True)
class Hit:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up on a slow answer is expected here


class Receiver:
    """A real HTTP server on 127.0.0.1: records every POST, answers `codes` in order, then 200."""

    def __init__(self, codes: Sequence[int] = (), delay_s: float = 0.0) -> None:
        self.hits: list[Hit] = []
        self._codes = list(codes)
        self._lock = threading.Lock()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver._lock:
                    receiver.hits.append(Hit(self.path, headers, body))
                    code = receiver._codes.pop(0) if receiver._codes else 200
                receiver._release.wait(delay_s)
                self.send_response(code)
                if 300 <= code < 400:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()


def dead_url() -> str:
    """A URL whose port has nothing listening (connections are refused at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(codes: Sequence[int] = (), delay_s: float = 0.0) -> Receiver:
        made.append(Receiver(codes, delay_s))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def notifier() -> Iterator[Callable[..., Notifier]]:
    made: list[Notifier] = []

    def make(rules: Sequence[NotifyRule], **kwargs: Any) -> Notifier:
        made.append(Notifier(rules, job_id="j-1", job_name="llama", **kwargs))
        return made[-1]

    yield make
    for n in made:
        n.close(timeout_s=1)


def timed(fn: Callable[[], object]) -> float:
    start = time.monotonic()
    fn()
    return time.monotonic() - start


# ---------------------------------------------------------------- config and pure helpers


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sink": "webhook"}, "url: a webhook rule needs a url"),
        ({"sink": "apprise"}, "url: an apprise rule needs a url"),
        ({"sink": "webhook", "url": "ftp://x/y"}, "url: a webhook url must start with http"),
        ({"sink": "command"}, "command: a command rule needs a program"),
        ({"sink": "command", "command": [""]}, r"command: .* got \[''\]"),
        ({"sink": "command", "command": ["x"], "events": []}, r"events: .* got \[\]"),
        ({"sink": "command", "command": ["x"], "states": ["FAILD"]}, "states: 'FAILD' is not a"),
        (
            {"sink": "webhook", "url": "http://h", "secret": "s", "secret_env": "S"},
            "secret_env: set secret or secret_env, not both",
        ),
    ],
)
def test_rule_validation_names_field_and_value(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NotifyRule(**fields)


def test_rule_errors_read_well_inside_a_job_spec() -> None:
    from trainguard.errors import SpecError
    from trainguard.spec.models import validate_spec

    pools = [{"role": "worker", "replicas": 1, "command": ["x"]}]
    rules = [{"sink": "webhook"}, {"sink": "command", "command": ["x"], "states": ["FAILD"]}]
    with pytest.raises(SpecError) as err:
        validate_spec({"name": "a", "worker_pools": pools, "notifications": rules})
    text = str(err.value)
    assert "notifications[0].url: a webhook rule needs a url" in text
    assert "notifications[1].states: 'FAILD' is not a job state" in text


def test_rule_states_are_normalised() -> None:
    rule = NotifyRule(sink="command", command=["x"], states=["failed", " Succeeded "])
    assert rule.states == ["FAILED", "SUCCEEDED"]


def test_sign_and_verify() -> None:
    body = b'{"event":"hang"}'
    header = sign("s3cret", body)
    assert header.startswith("sha256=") and len(header) == len("sha256=") + 64
    assert verify("s3cret", body, header)
    assert not verify("wrong", body, header)
    assert not verify("s3cret", body + b" ", header)
    assert not verify("s3cret", body, None)
    assert not verify("s3cret", body, "sha256=é")


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


# ---------------------------------------------------------------- command


RECORD = r"""
import json, os, sys
names = ["TRAINGUARD_EVENT", "TRAINGUARD_JOB_ID", "TRAINGUARD_JOB_NAME", "TRAINGUARD_EVENT_TEXT"]
seen = {"stdin": sys.stdin.read(), "env": {k: os.environ.get(k) for k in names}}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(seen) + "\n")
print("boom", file=sys.stderr)
sys.exit(int(sys.argv[2]))
"""


def test_command_sink_gets_json_on_stdin_and_env(
    tmp_path: Path, notifier: Callable[..., Notifier]
) -> None:
    out = tmp_path / "seen.jsonl"
    rule = NotifyRule(sink="command", command=[sys.executable, "-c", RECORD, str(out), "0"])
    n = notifier([rule])
    n.emit("hang", "worker-1 stuck in allreduce", replica="worker-1")
    n.close(timeout_s=10)
    (seen,) = [json.loads(line) for line in out.read_text().splitlines()]
    event = json.loads(seen["stdin"])
    assert event["event"] == "hang" and event["replica"] == "worker-1"
    assert seen["env"] == {
        "TRAINGUARD_EVENT": "hang",
        "TRAINGUARD_JOB_ID": "j-1",
        "TRAINGUARD_JOB_NAME": "llama",
        "TRAINGUARD_EVENT_TEXT": "worker-1 stuck in allreduce",
    }
    assert n.stats["delivered"] == 1


def test_command_sink_nonzero_exit_is_retried_then_failed(
    tmp_path: Path, notifier: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.notify")
    out = tmp_path / "seen.jsonl"
    rule = NotifyRule(
        sink="command", command=[sys.executable, "-c", RECORD, str(out), "3"], retries=2, **FAST
    )
    n = notifier([rule])
    n.emit("restart", "restart 2")
    wait_until(lambda: n.stats["failed"] == 1)
    assert len(out.read_text().splitlines()) == 3
    assert any("exit code 3: boom" in rec.getMessage() for rec in caplog.records)


def test_command_sink_missing_program_fails_without_retry(
    tmp_path: Path, notifier: Callable[..., Notifier]
) -> None:
    n = notifier([NotifyRule(sink="command", command=[str(tmp_path / "nope")], retries=3)])
    n.emit("restart", "restart 2")
    took = timed(lambda: wait_until(lambda: n.stats["failed"] == 1))
    assert took < 1  # no backoff waits: a missing program does not appear by retrying


# ---------------------------------------------------------------- apprise


def test_apprise_json_url_posts_to_a_local_receiver(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    pytest.importorskip("apprise")
    r = receiver()
    host = r.url.removeprefix("http://")
    n = notifier([NotifyRule(sink="apprise", url=f"json://{host}/apprise", **FAST)])
    n.emit("state_change", "llama failed: exit 1", state="FAILED", previous="RUNNING")
    wait_until(lambda: n.stats["delivered"] == 1)
    (hit,) = r.hits
    assert hit.path == "/apprise"
    assert hit.json["title"] == "trainguard: llama state_change"
    assert hit.json["message"] == "llama failed: exit 1"
    assert hit.json["type"] == "failure"


def test_apprise_missing_is_one_warning_and_no_crash(
    notifier: Callable[..., Notifier],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.notify")
    monkeypatch.setitem(sys.modules, "apprise", None)  # makes `import apprise` fail
    n = notifier([NotifyRule(sink="apprise", url="json://127.0.0.1:9/x", **FAST)])
    for i in range(3):
        n.emit("custom_message", f"m{i}")
    wait_until(lambda: n.stats["failed"] == 3)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "trainguard.notify"]
    assert len(lines) == 1 and "apprise is not installed" in lines[0]
