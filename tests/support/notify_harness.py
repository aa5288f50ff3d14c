"""A real HTTP receiver and notifier fixtures shared by the notification tests."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trainguard.notify.notifier import Notifier
from trainguard.spec.notify_rules import NotifyRule

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
