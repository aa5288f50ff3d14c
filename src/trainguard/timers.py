"""Time as a seam (issue 39): what must happen later is asked of a `Timers`, never of the
event loop directly, so that a test can move time by hand and see what fires
(`tests/support/fakes.py::FakeClock` keeps both the time and the timers).

The master, its hang watches, the fault injector and the waits for capacity and for a
backoff take one `Timers` beside their clock; in production it is `LOOP_TIMERS`, the
running asyncio loop's `call_later`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    """A call `Timers.later` scheduled; `cancel()` keeps it from ever running."""

    def cancel(self) -> None: ...


class Timers(Protocol):
    def later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        """Call `fn()` once, `delay_s` seconds from now (0 or less: as soon as may be, never
        inside this call)."""
        ...


class LoopTimers:
    """The real clock's timers: the running event loop's `call_later` (an asyncio
    `TimerHandle` is a `Timer`). Called only from inside the loop."""

    def later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay_s, fn)


LOOP_TIMERS: Timers = LoopTimers()
