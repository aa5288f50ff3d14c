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
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

from trainguard.errors import CallRefused
from trainguard.master.sdk_wire import (
    MAX_BODY_BYTES,
    MESSAGE_BURST,
    MESSAGE_RATE_PER_S,
    SHOWN_CHARS,
    Body,
    HttpError,
    RateBucket,
    json_object,
    read_checkpoint,
    read_given_step,
    read_metrics,
    read_patterns,
    read_replica,
    read_seconds,
    read_step,
    read_text,
    read_world,
    show,
)

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


_ROUTES: dict[str, Callable[[SdkHandler, str, Body], None]] = {
    "/v1/heartbeat": lambda h, replica, b: h.on_heartbeat(replica, read_step(b)),
    "/v1/hang_detect": lambda h, replica, b: h.on_hang_detect(replica, read_seconds(b)),
    "/v1/retryable_errors": lambda h, replica, b: h.on_retryable_errors(replica, read_patterns(b)),
    "/v1/message": lambda h, replica, b: h.on_message(replica, read_text(b)),
    "/v1/faulthandler": lambda h, replica, b: h.on_faulthandler(replica),
    "/v1/report": lambda h, replica, b: h.on_report(
        replica, read_step(b), read_metrics(b), read_checkpoint(b)
    ),
    "/v1/snapshot": lambda h, replica, b: h.on_snapshot(replica, read_given_step(b), read_world(b)),
}
_PING = "/v1/ping"
_MESSAGE = "/v1/message"
_OVER_RATE = (
    f"text: over {MESSAGE_RATE_PER_S:g} custom messages a second from this job (after a "
    f"first {MESSAGE_BURST}); this one was dropped"
)


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
        self._messages = RateBucket(MESSAGE_RATE_PER_S, MESSAGE_BURST)  # the job's, all replicas

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
                except HttpError as err:  # the stream is out of step now: answer, then close
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
            return HTTPStatus.NOT_FOUND, {"error": f"path: no route {request.path[:SHOWN_CHARS]}"}
        expected_method = "GET" if route is None else "POST"
        if request.method != expected_method:
            return HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"method: use {expected_method}"}
        if route is None:
            return HTTPStatus.OK, {"ok": True}
        try:
            body = json_object(request.body)
            replica = read_replica(body)
            if request.path == _MESSAGE and not self._messages.take(time.monotonic()):
                raise HttpError(HTTPStatus.TOO_MANY_REQUESTS, _OVER_RATE)
            route(self._handler, replica, body)  # validates before it calls the handler
        except HttpError as err:
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
            raise HttpError(HTTPStatus.BAD_REQUEST, "request line: expected METHOD PATH HTTP/1.x")
        method, target, version = parts
        headers: dict[str, str] = {}
        while (line := await _read_line(reader)) not in (b"\r\n", b"\n"):
            if not line:
                raise asyncio.IncompleteReadError(b"", None)
            if len(headers) >= _MAX_HEADERS:
                raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "headers: too many")
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
        raise HttpError(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "header: too long") from exc


def _content_length(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise HttpError(HTTPStatus.LENGTH_REQUIRED, "transfer-encoding: send Content-Length")
    raw = headers.get("content-length", "0")
    if not raw.isdigit():
        raise HttpError(HTTPStatus.BAD_REQUEST, f"content-length: not a number: {show(raw)}")
    if int(raw) > MAX_BODY_BYTES:
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body: over {MAX_BODY_BYTES} bytes")
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
