"""`trainguard run` on a terminal: the replicas' output scrolls above a panel that keeps the
job in view (rich's Live display; its redirection puts every print above the panel).

The panel reads the job from the store, as `trainguard status` would, at most every
READ_EVERY_S: it shows what the records say, never a second copy of the master's state.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

from rich.console import RenderableType
from rich.live import Live

from trainguard.cli.render import console, data_text, live_panel
from trainguard.records.queries import Reader

READ_EVERY_S = 0.5
RATE_WINDOW_S = 30.0
"""The step rate is measured over the progress of about this long."""


class LiveRun:
    def __init__(self, reader: Reader, out: TextIO, clock: Callable[[], float] = time.time) -> None:
        self.reader = reader
        self.console = console(out)
        self.clock = clock
        self.job_id: str | None = None
        self._lock = threading.Lock()
        self._view: dict[str, Any] | None = None
        self._read_s = float("-inf")
        self._activity: tuple[str, float] | None = None
        self._samples: deque[tuple[int, float]] = deque()
        self._live = Live(
            get_renderable=self._render,
            console=self.console,
            refresh_per_second=2,
            redirect_stdout=True,
            redirect_stderr=True,
        )

    def __enter__(self) -> LiveRun:
        self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._read_s = float("-inf")  # the last frame shows how the job ended
        self._live.stop()

    def say(self, line: str) -> None:
        """One of trainguard's own lines: printed above the panel, and what it is doing."""
        text = line if len(line) <= 160 else line[:157] + "..."
        self._activity = (text, self.clock())
        self._read_s = float("-inf")  # the store has news: read it for this frame
        self.console.print(data_text(f"trainguard: {line}", style="bold"))

    def _render(self) -> RenderableType:
        now = self.clock()
        with self._lock:
            if self.job_id is not None and now - self._read_s >= READ_EVERY_S:
                self._read_s = now
                try:
                    self._view = self.reader.status(self.job_id)
                except Exception:  # a store busy or gone for a moment: keep the last view
                    pass
                else:
                    self._sample(self._view)
            return live_panel(self._view, self._activity, self._rate(), now)

    def _sample(self, view: dict[str, Any]) -> None:
        progress = view.get("progress") or {}
        step, at_s = progress.get("step"), progress.get("at_s")
        if step is None or at_s is None:
            return
        samples = self._samples
        if samples and step < samples[-1][0]:
            samples.clear()  # a restart went back to a checkpoint: measure afresh
        if not samples or samples[-1] != (step, at_s):
            samples.append((step, at_s))
        while len(samples) > 2 and at_s - samples[0][1] > RATE_WINDOW_S:
            samples.popleft()

    def _rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (s0, t0), (s1, t1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else None
