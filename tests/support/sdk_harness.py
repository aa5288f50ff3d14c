"""A real SdkServer on an asyncio loop in a background thread, as the master runs it, and a
handler that records every call: shared by the SDK's client tests and its wire tests."""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from trainguard import sdk
from trainguard.errors import CallRefused
from trainguard.master.sdk_channel import SdkServer
from trainguard.storage.ids import new_token

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

    def on_snapshot(self, replica: str, step: int, world: int) -> None:
        self._add("snapshot", replica, step, world)

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
