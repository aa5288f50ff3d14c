"""The master's end of the SDK channel: a small HTTP/1.1 server on asyncio streams.

Why no web framework: the master is one asyncio loop, the routes are five JSON POSTs
from the job's own replicas, and the SDK side speaks plain `http.client`. What this
server does: keep-alive connections, `Content-Length` bodies up to 64 KiB, a per-job
bearer token, and strict validation with a one-line JSON error naming the field.

The handler is called on the event loop, so it must not block (hand the value on to
the master's queue and return). An exception in it answers 500; the server carries on.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

from trainguard.errors import CallRefused

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
MAX_REPLICA_CHARS = 128
MAX_PATTERNS = 100
MAX_PATTERN_CHARS = 1000
MAX_TEXT_CHARS = 4000
MAX_STEP = 10**15  # more steps than any run takes: a larger number is garbage
MAX_SECONDS = 10**7  # a hang_detect scope longer than ~115 days is a typo
HANG_DETECT_OFF = -1
"""The SDK's `hang_detect(-1)`: detection off in that scope (sdk.HANG_DETECT_OFF)."""

_MAX_LINE_BYTES = 8 * 1024
"""The longest request or header line read (asyncio's stream limit)."""
_MAX_HEADERS = 64
_IDLE_TIMEOUT_S = 900.0
"""A keep-alive connection quiet this long is closed (its replica may be gone); SDKs reconnect."""
_REQUEST_TIMEOUT_S = 10.0
"""Once a request has begun, the rest of it must arrive within this."""
_LINGER_S = 1.0
_LINGER_BYTES = 1024 * 1024
"""After an error that leaves a body unread, read and drop this much of it (at most for
_LINGER_S) before closing: closing on unread data resets the connection, and the client
could lose the error answer."""
_TOKEN_BYTES = 32
_SHOWN_CHARS = 60
"""How much of a rejected value an error message quotes."""


class SdkHandler(Protocol):
    """What the master does with each message. Called on the event loop: must not block."""

    def on_heartbeat(self, replica: str, step: int | None) -> None: ...

    def on_hang_detect(self, replica: str, seconds: float | None) -> None:
        """`seconds` -1: detection off in this scope; None: no scope active."""

    def on_retryable_errors(self, replica: str, patterns: list[str]) -> None: ...

    def on_message(self, replica: str, text: str) -> None: ...

    def on_report(
        self, replica: str, step: int | None, metrics: dict[str, object], checkpoint: str | None
    ) -> None:
        """Progress reported by `sdk.report` (also a heartbeat); `checkpoint` names a
        checkpoint the replica has just committed into the job's storage."""

    def on_faulthandler(self, replica: str) -> None:
        """The replica dumps its stacks on SIGUSR2: safe to send when py-spy cannot attach."""

    def on_snapshot(self, replica: str, step: int, world: int) -> None:
        """The replica stored its state for `step` in the job's shared memory (one of
        `world` ranks); also a heartbeat at that step."""


def new_token() -> str:
    """A random secret (a job's TRAINGUARD_TOKEN, a server's token).

    It never starts with "-", so `--token TOKEN` cannot be read as an option.
    """
    return "tg" + secrets.token_urlsafe(_TOKEN_BYTES)


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


_Body = dict[str, object]
_ROUTES: dict[str, Callable[[SdkHandler, str, _Body], None]] = {
    "/v1/heartbeat": lambda h, replica, b: h.on_heartbeat(replica, _step(b)),
    "/v1/hang_detect": lambda h, replica, b: h.on_hang_detect(replica, _seconds(b)),
    "/v1/retryable_errors": lambda h, replica, b: h.on_retryable_errors(replica, _patterns(b)),
    "/v1/message": lambda h, replica, b: h.on_message(replica, _text(b)),
    "/v1/faulthandler": lambda h, replica, b: h.on_faulthandler(replica),
    "/v1/report": lambda h, replica, b: h.on_report(replica, _step(b), _metrics(b), _checkpoint(b)),
    "/v1/snapshot": lambda h, replica, b: h.on_snapshot(replica, _given_step(b), _world(b)),
}
_PING = "/v1/ping"


class SdkServer:
    """Serves the SDK routes for one job on an ephemeral port (or `port`, when given)."""

    def __init__(
        self, handler: SdkHandler, token: str, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        if not token:
            raise ValueError("token: must not be empty")
        self._handler, self._host, self._requested_port = handler, host, port
        self._token = token
        self._expected = f"Bearer {token}".encode()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str | None = None) -> None:
        """Listen on `host` (default: the one given at construction)."""
        if host is not None:
            self._host = host
        self._server = await asyncio.start_server(
            self._serve, self._host, self._requested_port, limit=_MAX_LINE_BYTES
        )

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("SdkServer.port: the server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def token(self) -> str:
        """The value for TRAINGUARD_TOKEN."""
        return self._token

    @property
    def url(self) -> str:
        """The value for TRAINGUARD_MASTER_URL (with the host as given: bind a reachable one)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> SdkServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except _HttpError as err:  # the stream is out of step now: answer, then close
                    await _write(writer, err.status, {"error": err.message}, keep_alive=False)
                    await _linger(reader, writer)
                    return
                if request is None:
                    return
                status, answer = self._answer(request)
                await _write(writer, status, answer, request.keep_alive)
                if not request.keep_alive:
                    return
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    def _answer(self, request: _Request) -> tuple[HTTPStatus, dict[str, object]]:
        auth = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(auth, self._expected):
            return HTTPStatus.UNAUTHORIZED, {"error": "authorization: missing or wrong token"}
        route = _ROUTES.get(request.path)
        if route is None and request.path != _PING:
            return HTTPStatus.NOT_FOUND, {"error": f"path: no route {request.path[:_SHOWN_CHARS]}"}
        expected_method = "GET" if route is None else "POST"
        if request.method != expected_method:
            return HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"method: use {expected_method}"}
        if route is None:
            return HTTPStatus.OK, {"ok": True}
        try:
            body = _json_object(request.body)
            replica = _replica(body)
            route(self._handler, replica, body)  # validates before it calls the handler
        except _HttpError as err:
            return err.status, {"error": err.message}
        except CallRefused as err:  # well-formed, but asks for what cannot be
            return HTTPStatus.UNPROCESSABLE_ENTITY, {"error": str(err)}
        except Exception as exc:
            log.exception("SDK handler failed on %s", request.path)
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"handler failed: {exc!r}"}
        command = getattr(self._handler, "command_for", lambda _r: None)(replica)
        return HTTPStatus.OK, {"ok": True, **({"command": command} if command else {})}


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request, or None when the client closed the connection between requests."""
    async with asyncio.timeout(_IDLE_TIMEOUT_S):
        first = await _read_line(reader)
    if not first:
        return None
    async with asyncio.timeout(_REQUEST_TIMEOUT_S):
        parts = first.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "request line: expected METHOD PATH HTTP/1.x")
        method, target, version = parts
        headers: dict[str, str] = {}
        while (line := await _read_line(reader)) not in (b"\r\n", b"\n"):
            if not line:
                raise asyncio.IncompleteReadError(b"", None)
            if len(headers) >= _MAX_HEADERS:
                raise _HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "headers: too many")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(_content_length(headers))
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return _Request(method, target.partition("?")[0], headers, body, keep_alive)


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write_eof()
    drained = 0
    try:
        async with asyncio.timeout(_LINGER_S):
            while drained < _LINGER_BYTES and (chunk := await reader.read(_MAX_LINE_BYTES)):
                drained += len(chunk)
    except TimeoutError:
        pass


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.readline()
    except ValueError as exc:  # longer than the stream limit
        raise _HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header: too long") from exc


def _content_length(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise _HttpError(HTTPStatus.LENGTH_REQUIRED, "transfer-encoding: send Content-Length")
    raw = headers.get("content-length", "0")
    if not raw.isdigit():
        raise _HttpError(HTTPStatus.BAD_REQUEST, f"content-length: not a number: {_show(raw)}")
    if int(raw) > MAX_BODY_BYTES:
        raise _HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body: over {MAX_BODY_BYTES} bytes")
    return int(raw)


async def _write(
    writer: asyncio.StreamWriter, status: HTTPStatus, answer: dict[str, object], keep_alive: bool
) -> None:
    body = json.dumps(answer).encode()
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _json_object(raw: bytes) -> _Body:
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:
        raise _HttpError(HTTPStatus.BAD_REQUEST, f"body: malformed JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise _HttpError(HTTPStatus.BAD_REQUEST, "body: expected a JSON object")
    return value


def _bad(field: str, expected: str, value: object) -> _HttpError:
    return _HttpError(HTTPStatus.BAD_REQUEST, f"{field}: expected {expected}, got {_show(value)}")


def _show(value: object) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 3] + "..."


def _replica(body: _Body) -> str:
    value = body.get("replica")
    if not (isinstance(value, str) and 0 < len(value) <= MAX_REPLICA_CHARS and value.isprintable()):
        raise _bad("replica", f"a printable string of 1 to {MAX_REPLICA_CHARS} chars", value)
    return value


def _step(body: _Body) -> int | None:
    value = body.get("step")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEP:
        raise _bad("step", f"an integer from 0 to {MAX_STEP} or null", value)
    return value


def _given_step(body: _Body) -> int:
    step = _step(body)
    if step is None:
        raise _bad("step", f"an integer from 0 to {MAX_STEP}", None)
    return step


MAX_WORLD = 1_000_000


def _world(body: _Body) -> int:
    value = body.get("world")
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORLD:
        raise _bad("world", f"an integer from 1 to {MAX_WORLD}", value)
    return value


def _seconds(body: _Body) -> float | None:
    value = body.get("seconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad("seconds", "a number or null", value)
    if value > MAX_SECONDS:
        raise _bad("seconds", f"at most {MAX_SECONDS}", value)
    if value != HANG_DETECT_OFF and value <= 0:
        raise _bad("seconds", f"> 0 or {HANG_DETECT_OFF} (off)", value)
    return float(value)


def _patterns(body: _Body) -> list[str]:
    value = body.get("patterns")
    if not (isinstance(value, list) and len(value) <= MAX_PATTERNS):
        raise _bad("patterns", f"a list of at most {MAX_PATTERNS} strings", value)
    for i, pattern in enumerate(value):
        if not (isinstance(pattern, str) and len(pattern) <= MAX_PATTERN_CHARS):
            raise _bad(f"patterns[{i}]", f"a string of at most {MAX_PATTERN_CHARS} chars", pattern)
    return value


MAX_METRICS = 100
_CHECKPOINT_NAME = re.compile(r"^checkpoint_\d{6,20}$")


def _metrics(body: _Body) -> dict[str, object]:
    value = body.get("metrics")
    if not (isinstance(value, dict) and len(value) <= MAX_METRICS):
        raise _bad("metrics", f"an object of at most {MAX_METRICS} entries", value)
    for key, item in value.items():
        if len(key) > MAX_REPLICA_CHARS:
            raise _bad("metrics", f"keys of at most {MAX_REPLICA_CHARS} chars", key)
        if isinstance(item, str) and len(item) > MAX_TEXT_CHARS:
            raise _bad(f"metrics.{key}", f"a string of at most {MAX_TEXT_CHARS} chars", item)
        if isinstance(item, float) and not math.isfinite(item):
            raise _bad(f"metrics.{key}", "a finite number", item)
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**63:
            raise _bad(f"metrics.{key}", "an integer that fits in 64 bits", item)
        if not (isinstance(item, int | float | str | bool) or item is None):
            raise _bad(f"metrics.{key}", "a number, string, boolean or null", item)
    return value


def _checkpoint(body: _Body) -> str | None:
    value = body.get("checkpoint")
    if value is not None and not (isinstance(value, str) and _CHECKPOINT_NAME.match(value)):
        raise _bad("checkpoint", "null or a name like checkpoint_000001", value)
    return value


def _text(body: _Body) -> str:
    value = body.get("text")
    if not (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS):
        raise _bad("text", f"a string of at most {MAX_TEXT_CHARS} chars", value)
    return value
