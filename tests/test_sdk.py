"""The SDK channel end to end: the real client (`trainguard.sdk`) against a real SdkServer.

The server runs on an asyncio loop in a background thread; the client is called from the
test thread, as training code would call it. Any SdkWarning a test does not expect fails it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from trainguard import sdk
from trainguard.backends.net import free_port
from trainguard.errors import CallRefused
from trainguard.master import sdk_channel as sdk_server
from trainguard.master.sdk_channel import SdkServer, new_token

pytestmark = pytest.mark.filterwarnings("error::trainguard.sdk.SdkWarning")

REPLICA = "worker-1"
WAIT_S = 10.0
T = TypeVar("T")
ENV_NAMES = (sdk.ENV_MASTER_URL, sdk.ENV_TOKEN, sdk.ENV_REPLICA, sdk.ENV_FAULTHANDLER_FILE)


class Recorder:
    """An SdkHandler that records every call; `fail` makes it raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.fail = False
        self.refuse: str | None = None  # on_report refuses with this reason

    def _add(self, *call: object) -> None:
        if self.fail:
            raise RuntimeError("handler bug")
        self.calls.append(call)

    def on_heartbeat(self, replica: str, step: int | None) -> None:
        self._add("heartbeat", replica, step)

    def on_hang_detect(self, replica: str, seconds: float | None) -> None:
        self._add("hang_detect", replica, seconds)

    def on_retryable_errors(self, replica: str, patterns: list[str]) -> None:
        self._add("retryable_errors", replica, patterns)

    def on_message(self, replica: str, text: str) -> None:
        self._add("message", replica, text)

    def on_faulthandler(self, replica: str) -> None:
        self._add("faulthandler", replica)

    def on_report(
        self, replica: str, step: int | None, metrics: dict[str, object], checkpoint: str | None
    ) -> None:
        if self.refuse:
            raise CallRefused(self.refuse)
        self._add("report", replica, step, metrics, checkpoint)


class Loop:
    """An asyncio loop in a daemon thread, as the master's loop is to training code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    def serve(self, handler: Recorder, token: str, port: int = 0) -> SdkServer:
        server = SdkServer(handler, token, port=port)
        self.run(server.start())
        return server

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        self.loop.close()


@dataclass(frozen=True)
class Master:
    server: SdkServer
    recorder: Recorder
    token: str


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def clean_sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts outside trainguard, with the SDK's process state forgotten."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    sdk._reset_for_tests()
    yield
    sdk._reset_for_tests()


@pytest.fixture
def master(loop: Loop) -> Iterator[Master]:
    recorder, token = Recorder(), new_token()
    server = loop.serve(recorder, token)
    assert server.token == token
    yield Master(server, recorder, token)
    loop.run(server.close())


@pytest.fixture
def under_trainguard(master: Master, monkeypatch: pytest.MonkeyPatch) -> Master:
    """The environment trainguard gives a replica, pointing at `master`."""
    point_sdk_at(monkeypatch, master.server.url, master.token)
    return master


def point_sdk_at(monkeypatch: pytest.MonkeyPatch, url: str, token: str) -> None:
    monkeypatch.setenv(sdk.ENV_MASTER_URL, url)
    monkeypatch.setenv(sdk.ENV_TOKEN, token)
    monkeypatch.setenv(sdk.ENV_REPLICA, REPLICA)


@contextmanager
def sdk_warnings() -> Iterator[list[str]]:
    """Every SdkWarning raised inside, as text (the SDK itself must give each kind once)."""
    texts: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield texts
    texts.extend(str(w.message) for w in caught if issubclass(w.category, sdk.SdkWarning))


def hang_values(recorder: Recorder) -> list[object]:
    return [c[2] for c in recorder.calls if c[0] == "hang_detect"]


# ---------------------------------------------------------------- client against server


def test_heartbeat_with_and_without_step(under_trainguard: Master) -> None:
    assert sdk.enabled()
    sdk.heartbeat(42)
    sdk.heartbeat()
    assert under_trainguard.recorder.calls == [
        ("heartbeat", REPLICA, 42),
        ("heartbeat", REPLICA, None),
    ]


def test_hang_detect_context_manager_nests_and_restores(under_trainguard: Master) -> None:
    with sdk.hang_detect(180):
        with sdk.hang_detect(-1):
            pass
        with pytest.raises(KeyError), sdk.hang_detect(30):
            raise KeyError("the scope still closes")
    assert hang_values(under_trainguard.recorder) == [180.0, -1.0, 180.0, 30.0, 180.0, None]


def test_hang_detect_decorator(under_trainguard: Master) -> None:
    @sdk.hang_detect(45)
    def save_checkpoint(x: int) -> int:
        """Doc kept."""
        return x * 2

    assert save_checkpoint(2) == 4
    with sdk.hang_detect(-1):
        assert save_checkpoint(3) == 6
    assert save_checkpoint.__name__ == "save_checkpoint"
    assert save_checkpoint.__doc__ == "Doc kept."
    assert hang_values(under_trainguard.recorder) == [45.0, None, -1.0, 45.0, -1.0, None]


def test_hang_detect_scopes_across_threads(under_trainguard: Master) -> None:
    """A's scope ends while B's, entered later, is still open: B's value stays in force."""
    a_entered, b_entered, a_exited = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with sdk.hang_detect(100):
            a_entered.set()
            b_entered.wait(WAIT_S)
        a_exited.set()

    def b() -> None:
        a_entered.wait(WAIT_S)
        with sdk.hang_detect(50):
            b_entered.set()
            a_exited.wait(WAIT_S)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert hang_values(under_trainguard.recorder) == [100.0, 50.0, 50.0, None]


def test_set_retryable_errors_and_custom_message(under_trainguard: Master) -> None:
    sdk.set_retryable_errors([r"NCCL timeout \d+", "flaky"])
    sdk.set_retryable_errors([])
    sdk.send_custom_message("eval loss 1.72")
    assert under_trainguard.recorder.calls == [
        ("retryable_errors", REPLICA, [r"NCCL timeout \d+", "flaky"]),
        ("retryable_errors", REPLICA, []),
        ("message", REPLICA, "eval loss 1.72"),
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: sdk.hang_detect(0), ValueError),
        (lambda: sdk.hang_detect(-2), ValueError),
        (lambda: sdk.hang_detect(float("nan")), ValueError),
        (lambda: sdk.hang_detect(float("inf")), ValueError),
        (lambda: sdk.hang_detect(True), TypeError),
        (lambda: sdk.hang_detect("5"), TypeError),  # type: ignore[arg-type]
        (lambda: sdk.heartbeat("7"), TypeError),  # type: ignore[arg-type]
        (lambda: sdk.heartbeat(-1), TypeError),
        (lambda: sdk.set_retryable_errors("one string"), TypeError),  # type: ignore[arg-type]
        (lambda: sdk.set_retryable_errors([1]), TypeError),  # type: ignore[list-item]
        (lambda: sdk.send_custom_message(None), TypeError),  # type: ignore[arg-type]
    ],
)
def test_wrong_arguments_raise(call: object, error: type[Exception]) -> None:
    """A bug in the caller, not a fault of the master: raised, whether under trainguard or not."""
    with pytest.raises(error):
        call()  # type: ignore[operator]


def test_wrong_token_warns_once_and_never_raises(
    master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_sdk_at(monkeypatch, master.server.url, "not-the-token")
    with sdk_warnings() as texts:
        sdk.heartbeat(1)
        sdk.set_retryable_errors(["x"])
        with sdk.hang_detect(10):
            sdk.send_custom_message("hi")
    assert len(texts) == 1
    assert "refused" in texts[0] and "401" in texts[0]
    assert master.recorder.calls == []


def test_handler_error_answers_500_and_client_warns(under_trainguard: Master) -> None:
    under_trainguard.recorder.fail = True
    with sdk_warnings() as texts:
        sdk.heartbeat(1)
    assert len(texts) == 1 and "500" in texts[0]
    under_trainguard.recorder.fail = False
    sdk.heartbeat(2)  # the server carries on, on the same connection
    assert under_trainguard.recorder.calls == [("heartbeat", REPLICA, 2)]


def test_master_down_warns_once_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    point_sdk_at(monkeypatch, f"http://127.0.0.1:{free_port()}", "token")
    started = time.monotonic()
    with sdk_warnings() as texts:
        sdk.heartbeat(1)
        with sdk.hang_detect(60):
            sdk.heartbeat(2)
        sdk.set_retryable_errors(["x"])
        sdk.send_custom_message("hi")
    assert time.monotonic() - started < sdk._TIMEOUT_S
    assert len(texts) == 1 and "unreachable" in texts[0]


def test_state_lost_while_master_down_is_sent_when_it_answers(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats are dropped while the master is away (and for a short quiet spell after),
    but the scope in force and the retryable patterns reach it once it answers again."""
    quiet_s = 0.2
    monkeypatch.setattr(sdk, "_RETRY_AFTER_S", quiet_s)
    port, token, recorder = free_port(), new_token(), Recorder()
    point_sdk_at(monkeypatch, f"http://127.0.0.1:{port}", token)
    with sdk_warnings() as texts, sdk.hang_detect(-1):
        sdk.set_retryable_errors(["flaky"])
        server = loop.serve(recorder, token, port=port)
        sdk.heartbeat(1)  # within the quiet spell: dropped
        time.sleep(quiet_s * 2)
        sdk.heartbeat(2)
    loop.run(server.close())
    assert len(texts) == 1 and "unreachable" in texts[0]
    assert sorted(recorder.calls[:2], key=str) == [
        ("hang_detect", REPLICA, -1.0),
        ("retryable_errors", REPLICA, ["flaky"]),
    ]
    assert recorder.calls[2:] == [("heartbeat", REPLICA, 2), ("hang_detect", REPLICA, None)]


def test_client_reconnects_when_the_server_closed_an_idle_connection(
    under_trainguard: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle_s = 0.05
    monkeypatch.setattr(sdk_server, "_IDLE_TIMEOUT_S", idle_s)
    sdk.heartbeat(1)  # this connection starts its idle wait with the patched limit
    time.sleep(idle_s * 6)
    sdk.heartbeat(2)
    assert under_trainguard.recorder.calls == [
        ("heartbeat", REPLICA, 1),
        ("heartbeat", REPLICA, 2),
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, sdk.ENV_MASTER_URL),
        ({sdk.ENV_MASTER_URL: "http://127.0.0.1:1"}, sdk.ENV_TOKEN),
        (
            {sdk.ENV_MASTER_URL: "https://x:1", sdk.ENV_TOKEN: "t", sdk.ENV_REPLICA: "w"},
            "not http://host:port",
        ),
        (
            {sdk.ENV_MASTER_URL: "http://x:port", sdk.ENV_TOKEN: "t", sdk.ENV_REPLICA: "w"},
            "not http://host:port",
        ),
    ],
)
def test_outside_trainguard_every_call_is_a_no_op_with_one_warning(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with sdk_warnings() as texts:
        assert not sdk.enabled()
        sdk.heartbeat(1)
        sdk.heartbeat()
        with sdk.hang_detect(60):
            sdk.set_retryable_errors(["x"])
        sdk.send_custom_message("hi")
    assert len(texts) == 1 and expected in texts[0]


def test_warning_points_at_the_training_code() -> None:
    @sdk.hang_detect(5)
    def step() -> None:
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
    (warning,) = caught
    assert warning.filename == __file__


def test_round_trip_cost(under_trainguard: Master) -> None:
    """One heartbeat on the persistent connection, median of many: well under a step."""
    calls = 200
    sdk.heartbeat(0)  # connect first
    costs = []
    for step in range(calls):
        started = time.perf_counter()
        sdk.heartbeat(step)
        costs.append(time.perf_counter() - started)
    median_ms = statistics.median(costs) * 1000
    print(f"heartbeat round trip: median {median_ms:.3f} ms over {calls} calls")
    assert len(under_trainguard.recorder.calls) == calls + 1
    assert median_ms < 50


# ---------------------------------------------------------------- the wire, raw


def request(
    master: Master,
    path: str,
    body: bytes | str | None = None,
    method: str = "POST",
    token: str | None = "right",
    conn: http.client.HTTPConnection | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, object]]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", master.server.port, timeout=WAIT_S)
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {master.token if token == 'right' else token}"
    conn.request(method, path, body.encode() if isinstance(body, str) else body, sent)
    response = conn.getresponse()
    raw = response.read().decode()
    assert "\n" not in raw  # one line
    return response.status, json.loads(raw)


LONG = "r" * (sdk_server.MAX_REPLICA_CHARS + 1)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/heartbeat", "{", "body"),
        ("/v1/heartbeat", "[1]", "body"),
        ("/v1/heartbeat", b"\xff", "body"),
        ("/v1/heartbeat", '{"step": 1}', "replica"),
        ("/v1/heartbeat", '{"replica": "", "step": 1}', "replica"),
        ("/v1/heartbeat", f'{{"replica": "{LONG}"}}', "replica"),
        ("/v1/heartbeat", '{"replica": "a\\nb"}', "replica"),
        ("/v1/heartbeat", '{"replica": 7}', "replica"),
        ("/v1/heartbeat", '{"replica": "w", "step": "x"}', "step"),
        ("/v1/heartbeat", '{"replica": "w", "step": true}', "step"),
        ("/v1/heartbeat", '{"replica": "w", "step": 1.5}', "step"),
        ("/v1/heartbeat", '{"replica": "w", "step": -1}', "step"),
        ("/v1/heartbeat", json.dumps({"replica": "w", "step": 10**30}), "step"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": 1e30}', "seconds"),
        ("/v1/report", '{"replica": "w", "metrics": {"loss": 1e999}}', "metrics.loss"),
        ("/v1/report", json.dumps({"replica": "w", "metrics": {"n": 10**30}}), "metrics.n"),
        ("/v1/report", json.dumps({"replica": "w", "metrics": {"k" * 200: 1}}), "metrics"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": 0}', "seconds"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": -2}', "seconds"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": "60"}', "seconds"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": false}', "seconds"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": 1e999}', "seconds"),
        ("/v1/hang_detect", '{"replica": "w", "seconds": NaN}', "body"),
        ("/v1/retryable_errors", '{"replica": "w", "patterns": "x"}', "patterns"),
        ("/v1/retryable_errors", '{"replica": "w"}', "patterns"),
        ("/v1/retryable_errors", '{"replica": "w", "patterns": ["a", 1]}', "patterns[1]"),
        (
            "/v1/retryable_errors",
            json.dumps({"replica": "w", "patterns": ["p"] * (sdk_server.MAX_PATTERNS + 1)}),
            "patterns",
        ),
        (
            "/v1/retryable_errors",
            json.dumps({"replica": "w", "patterns": ["p" * (sdk_server.MAX_PATTERN_CHARS + 1)]}),
            "patterns[0]",
        ),
        ("/v1/message", '{"replica": "w"}', "text"),
        (
            "/v1/message",
            json.dumps({"replica": "w", "text": "t" * (sdk_server.MAX_TEXT_CHARS + 1)}),
            "text",
        ),
        ("/v1/faulthandler", "{}", "replica"),
    ],
)
def test_bad_bodies_answer_400_naming_the_field(
    master: Master, path: str, body: str | bytes, field: str
) -> None:
    status, answer = request(master, path, body)
    assert status == 400
    assert str(answer["error"]).startswith(f"{field}: "), answer
    assert master.recorder.calls == []


@pytest.mark.parametrize(
    ("path", "body", "call"),
    [
        ("/v1/heartbeat", '{"replica": "w"}', ("heartbeat", "w", None)),
        ("/v1/heartbeat", '{"replica": "w", "step": 0, "extra": 1}', ("heartbeat", "w", 0)),
        ("/v1/hang_detect", '{"replica": "w", "seconds": -1}', ("hang_detect", "w", -1.0)),
        ("/v1/hang_detect", '{"replica": "w", "seconds": 0.5}', ("hang_detect", "w", 0.5)),
        ("/v1/hang_detect", '{"replica": "w", "seconds": null}', ("hang_detect", "w", None)),
        ("/v1/retryable_errors", '{"replica": "w", "patterns": []}', ("retryable_errors", "w", [])),
        (
            "/v1/message",
            json.dumps({"replica": "w", "text": "t" * sdk_server.MAX_TEXT_CHARS}),
            ("message", "w", "t" * sdk_server.MAX_TEXT_CHARS),
        ),
        ("/v1/faulthandler", '{"replica": "w"}', ("faulthandler", "w")),
    ],
)
def test_good_bodies_reach_the_handler(
    master: Master, path: str, body: str, call: tuple[object, ...]
) -> None:
    assert request(master, path, body) == (200, {"ok": True})
    assert master.recorder.calls == [call]


def test_token_routes_and_methods(master: Master) -> None:
    beat = '{"replica": "w"}'
    assert request(master, "/v1/heartbeat", beat, token=None)[0] == 401
    assert request(master, "/v1/heartbeat", beat, token="wrong")[0] == 401
    assert request(master, "/v1/nowhere", beat, token="wrong")[0] == 401
    assert request(master, "/v1/ping", method="GET", token=None)[0] == 401
    status, answer = request(master, "/v1/nowhere", beat)
    assert status == 404 and str(answer["error"]).startswith("path: ")
    assert request(master, "/v1/heartbeat", method="GET")[0] == 405
    assert request(master, "/v1/ping", method="GET") == (200, {"ok": True})
    assert master.recorder.calls == []


def test_keep_alive_serves_many_requests_on_one_connection(master: Master) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", master.server.port, timeout=WAIT_S)
    request(master, "/v1/ping", method="GET", conn=conn)
    sock = conn.sock
    for step in range(3):
        beat = json.dumps({"replica": "w", "step": step})
        assert request(master, "/v1/heartbeat", beat, conn=conn)[0] == 200
    assert request(master, "/v1/nowhere", "{}", conn=conn)[0] == 404  # an error keeps it too
    assert request(master, "/v1/ping", method="GET", conn=conn)[0] == 200
    assert conn.sock is sock
    conn.close()


@pytest.mark.parametrize("size", [sdk_server.MAX_BODY_BYTES, 8 * sdk_server.MAX_BODY_BYTES])
def test_oversized_body_answers_413(master: Master, size: int) -> None:
    """Even when the client is still sending the body as the answer goes out."""
    body = json.dumps({"replica": "w", "text": "t" * size})
    status, answer = request(master, "/v1/message", body)
    assert status == 413 and str(answer["error"]).startswith("body: ")
    assert master.recorder.calls == []


def test_chunked_body_answers_411(master: Master) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", master.server.port, timeout=WAIT_S)
    headers = {"Authorization": f"Bearer {master.token}"}
    conn.request("POST", "/v1/heartbeat", iter([b'{"replica": "w"}']), headers)  # chunked
    response = conn.getresponse()
    assert response.status == 411
    conn.close()


def test_a_refused_call_answers_422_with_the_reason(master: Master) -> None:
    master.recorder.refuse = "checkpoint: checkpoint_000009 is not a committed checkpoint"
    body = '{"replica": "w", "metrics": {}, "checkpoint": "checkpoint_000009"}'
    status, answer = request(master, "/v1/report", body)
    assert status == 422 and str(answer["error"]).startswith("checkpoint: ")


def test_handler_exception_answers_500_and_server_carries_on(master: Master) -> None:
    master.recorder.fail = True
    status, answer = request(master, "/v1/heartbeat", '{"replica": "w"}')
    assert status == 500 and "RuntimeError" in str(answer["error"])
    master.recorder.fail = False
    assert request(master, "/v1/heartbeat", '{"replica": "w"}')[0] == 200


def test_server_misuse_is_reported() -> None:
    with pytest.raises(ValueError, match="token"):
        SdkServer(Recorder(), "")
    with pytest.raises(RuntimeError, match="not started"):
        _ = SdkServer(Recorder(), "t").port


def test_wire_constant_agrees() -> None:
    assert sdk.HANG_DETECT_OFF == sdk_server.HANG_DETECT_OFF


# ---------------------------------------------------------------- a real training process


REPLICA_SCRIPT = textwrap.dedent(
    """
    import os, signal
    from trainguard import sdk

    assert sdk.enabled()
    sdk.heartbeat(7)
    with sdk.hang_detect(60):
        sdk.heartbeat()

    @sdk.hang_detect(-1)
    def save():
        pass

    save()
    sdk.set_retryable_errors([r"flaky \\d+"])
    sdk.send_custom_message("hello from the replica")
    os.kill(os.getpid(), signal.SIGUSR2)  # faulthandler dumps the stacks; the process lives on
    print("done")
    """
)


def test_replica_process_reaches_the_master(under_trainguard: Master, tmp_path: Path) -> None:
    dump = tmp_path / "stacks.txt"
    env = {**os.environ, sdk.ENV_FAULTHANDLER_FILE: str(dump)}
    run = subprocess.run(
        [sys.executable, "-c", REPLICA_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "done"
    assert "SdkWarning" not in run.stderr
    assert under_trainguard.recorder.calls == [
        ("faulthandler", REPLICA),
        ("heartbeat", REPLICA, 7),
        ("hang_detect", REPLICA, 60.0),
        ("heartbeat", REPLICA, None),
        ("hang_detect", REPLICA, None),
        ("hang_detect", REPLICA, -1.0),
        ("hang_detect", REPLICA, None),
        ("retryable_errors", REPLICA, [r"flaky \d+"]),
        ("message", REPLICA, "hello from the replica"),
    ]
    assert "most recent call first" in dump.read_text()


IMPORT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    started = time.perf_counter()
    from trainguard import sdk
    took = time.perf_counter() - started
    heavy = [m for m in ("pydantic", "sqlalchemy", "yaml", "http.client") if m in sys.modules]
    print(took, *heavy)
    """
)


def test_import_is_fast_and_light() -> None:
    """Training code pays milliseconds for the import; http.client waits for the first call."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    took, *heavy = run.stdout.split()
    assert heavy == []
    assert float(took) < 0.5
