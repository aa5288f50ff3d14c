"""The CLI sends a home's server token only to the server that made it (issue 37): a
listener another local user binds on a loopback port gets no token, even when it relays
the CLI's challenge to the real server."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import TG
from test_server import Server

from trainguard.service.challenge import challenge_proof


class _Listener(http.server.ThreadingHTTPServer):
    """A plain HTTP listener on a free loopback port that records every request's headers;
    with `relay_to`, it passes each request on to that server and returns its answer."""

    def __init__(self, relay_to: str | None = None) -> None:
        self.seen: list[dict[str, str]] = []
        self.relay_to = relay_to
        super().__init__(("127.0.0.1", 0), _Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Listener

    def log_message(self, *args: Any) -> None:
        pass

    def _any(self) -> None:
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else None
        status, answer = 401, b'{"detail": "missing or wrong token"}'
        if self.server.relay_to is not None:
            target = urlsplit(self.server.relay_to)
            conn = http.client.HTTPConnection(target.hostname or "", target.port, timeout=10)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request(self.command, self.path, body, headers)
            resp = conn.getresponse()
            status, answer = resp.status, resp.read()
            conn.close()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = _any


@pytest.fixture
def server(tg: TG) -> Iterator[Server]:
    srv = Server(tg).start()  # no token given: it makes the home's
    yield srv
    srv.stop()


def _sent_token(listener: _Listener, token: str) -> bool:
    return any(token in value for headers in listener.seen for value in headers.values())


@pytest.mark.slow
@pytest.mark.parametrize("relay", [False, True], ids=["plain-listener", "relaying-listener"])
def test_a_listener_on_another_port_gets_no_token(tg: TG, server: Server, relay: bool) -> None:
    assert server.home_token
    listener = _Listener(relay_to=server.url if relay else None)
    try:
        res = tg("jobs", "--server", listener.url)
    finally:
        listener.stop()
    assert listener.seen, "the CLI never reached the listener"
    assert not _sent_token(listener, server.home_token), listener.seen
    assert res.returncode == 1 and "the server did not prove it issued it" in res.stderr, res


@pytest.mark.slow
def test_the_server_that_made_the_token_gets_it_under_any_loopback_name(
    tg: TG, server: Server
) -> None:
    port = urlsplit(server.url).port
    for url in (server.url, f"http://localhost:{port}", f"{server.url}/"):
        res = tg("jobs", "--server", url, "--json")
        assert res.returncode == 0, (url, res.stderr)


def test_the_proof_is_bound_to_the_token_the_nonce_and_the_address() -> None:
    proof = challenge_proof("tok", "ab" * 16, "127.0.0.1", 8470)
    assert proof == challenge_proof("tok", "ab" * 16, "::ffff:127.0.0.1", 8470)  # dual stack
    for other in (
        challenge_proof("other", "ab" * 16, "127.0.0.1", 8470),
        challenge_proof("tok", "cd" * 16, "127.0.0.1", 8470),
        challenge_proof("tok", "ab" * 16, "127.0.0.2", 8470),
        challenge_proof("tok", "ab" * 16, "127.0.0.1", 8471),
    ):
        assert other != proof
