"""The SDK channel's wire, raw: bodies, tokens, methods, limits and refusals, sent with
http.client to a real SdkServer (tests/support/sdk_harness.py)."""

from __future__ import annotations

import http.client
import json

import pytest
from sdk_harness import (  # noqa: F401  (fixtures)
    WAIT_S,
    Master,
    Recorder,
    clean_sdk,
    loop,
    master,
)

from trainguard import sdk
from trainguard.master import sdk_wire
from trainguard.master.sdk_channel import SdkServer
from trainguard.spec import limits

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
    """One call; on a connection of its own unless `conn` is given (then the caller's)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", master.server.port, timeout=WAIT_S)
    try:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {master.token if token == 'right' else token}"
        conn.request(method, path, body.encode() if isinstance(body, str) else body, sent)
        response = conn.getresponse()
        raw = response.read().decode()
    finally:
        if own:
            conn.close()
    assert "\n" not in raw  # one line
    return response.status, json.loads(raw)


LONG = "r" * (sdk_wire.MAX_REPLICA_CHARS + 1)


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
            json.dumps({"replica": "w", "patterns": ["p"] * (limits.MAX_PATTERNS + 1)}),
            "patterns",
        ),
        (
            "/v1/retryable_errors",
            json.dumps({"replica": "w", "patterns": ["p" * (limits.MAX_PATTERN_CHARS + 1)]}),
            "patterns[0]",
        ),
        ("/v1/retryable_errors", '{"replica": "w", "patterns": ["ok", "  "]}', "patterns[1]"),
        ("/v1/retryable_errors", '{"replica": "w", "patterns": [""]}', "patterns[0]"),
        ("/v1/message", '{"replica": "w"}', "text"),
        (
            "/v1/message",
            json.dumps({"replica": "w", "text": "t" * (sdk_wire.MAX_TEXT_CHARS + 1)}),
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
            json.dumps({"replica": "w", "text": "t" * sdk_wire.MAX_TEXT_CHARS}),
            ("message", "w", "t" * sdk_wire.MAX_TEXT_CHARS),
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


@pytest.mark.parametrize("size", [sdk_wire.MAX_BODY_BYTES, 8 * sdk_wire.MAX_BODY_BYTES])
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
    assert sdk.HANG_DETECT_OFF == sdk_wire.HANG_DETECT_OFF
