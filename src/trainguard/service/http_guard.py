"""What keeps a web page from driving the server (DNS rebinding, CSRF, framing, big bodies).

A job is a command, so a request that submits one is remote code execution for whoever
can send it. A page on another site can make a browser send requests to 127.0.0.1:
with a rebinding domain under its own name (so the `Host` header is checked against the
addresses the server listens on), or as a "simple" cross-site form or text POST (so a
state-changing request must be JSON, which a browser sends cross-site only after a CORS
preflight that this server never grants). The page cannot be framed, and request bodies
are capped before they are read whole.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 1024 * 1024
"""A job spec is a few KiB; a request body larger than this is refused (413)."""

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _hostname(header: str) -> str:
    """`[::1]:8470` -> `::1`, `localhost:8470` -> `localhost`."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _is_loopback_name(name: str) -> bool:
    if name.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_allowed(header: str | None, bind_host: str, extra: Iterable[str] = ()) -> bool:
    """Whether a request's Host names this server (not a name an attacker controls)."""
    if header is None:
        return False
    name = _hostname(header.strip()).lower()
    if bind_host in ("0.0.0.0", "::", ""):
        return True  # every interface: a token is required, which a page cannot know
    allowed = {bind_host.lower(), *(h.lower() for h in extra)}
    return name in allowed or (_is_loopback_name(name) and _is_loopback_name(bind_host))


class Guard:
    """ASGI middleware: Host check, JSON-only state changes, a body cap, security headers."""

    def __init__(
        self,
        app: ASGIApp,
        bind_host: str,
        allowed_hosts: Iterable[str] = (),
        max_body: int = MAX_BODY,
    ) -> None:
        self.app = app
        self.bind_host = bind_host
        self.allowed_hosts = tuple(allowed_hosts)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not host_allowed(headers.get("host"), self.bind_host, self.allowed_hosts):
            await _reply(send, 400, "invalid Host header: not an address this server listens on")
            return
        method = str(scope["method"]).upper()
        if method not in _SAFE_METHODS:
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                why = "a request that changes state must be JSON (Content-Type: application/json)"
                await _reply(send, 415, why)
                return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _reply(send, 413, f"the request body is larger than {self.max_body} bytes")
            return

        if length is None and method not in _SAFE_METHODS:
            # No length given (chunked): read it here, up to the cap, then hand it on.
            body = bytearray()
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body += message.get("body", b"")
                more = bool(message.get("more_body", False))
                if len(body) > self.max_body:
                    await _reply(
                        send, 413, f"the request body is larger than {self.max_body} bytes"
                    )
                    return
            receive = _replay(bytes(body))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
