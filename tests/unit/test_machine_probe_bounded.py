"""A probe abandoned at its time limit may finish after the master's loop has closed: it
must end quietly (an exception in its thread would be printed at exit and fail pytest)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from trainguard.backends.machine_probe import bounded


def test_an_abandoned_probe_that_finishes_after_its_loop_closed_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    finished = threading.Event()

    def slow() -> str:
        time.sleep(0.3)
        finished.set()
        return "late"

    assert asyncio.run(bounded(slow, 0.05)) is None  # the loop closes at once after
    assert finished.wait(5)
    time.sleep(0.1)  # its thread hands the answer to the closed loop now
    assert seen == []
