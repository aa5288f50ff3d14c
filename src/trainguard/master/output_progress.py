"""Progress read from a replica's output, for scripts that never call `sdk.report` (issue 20).

One replica's output is read (the job's first rank unless the spec names another: most
trainers print from rank 0 only), by a fresh `ProgressReader` per run. What it reads goes
where an SDK report would (goodput, the progress chart, "work lost", fault injection at a
step), at most every `every_s` seconds, and stops for the job at the first SDK report of a
step: the code's own word comes first.
"""

from __future__ import annotations

from collections.abc import Callable

from trainguard.backends.interface import ReplicaOutput
from trainguard.classify.progress_text import ProgressReader, Sighting
from trainguard.spec.progress import ProgressOptions, compile_progress_pattern

HINT_AFTER_S = 30.0
"""A hint on how to get progress (a silent bar) is given after this long without a step."""
EVERY_S = 0.5
"""Forward at most this often: a bar updates many times a second, the store needs far fewer."""


class OutputProgress:
    def __init__(
        self,
        options: ProgressOptions,
        source: str,
        forward: Callable[[str, int, dict[str, object]], None],
        note: Callable[[str, str], None],
        later: Callable[[float, Callable[[], None]], object] | None = None,
        every_s: float = EVERY_S,
    ) -> None:
        """`forward(replica, step, metrics)` takes a step; `note(replica, text)` records
        once why reading stopped; `later(delay, fn)` calls fn after delay seconds (what
        was held back still goes out when the output goes quiet)."""
        self.pattern = compile_progress_pattern(options.pattern) if options.pattern else None
        self.enabled = options.read == "auto" or self.pattern is not None
        self.source = options.replica or source
        self.forward = forward
        self.note = note
        self.later = later
        self.every_s = every_s
        self._flush_due = False
        self.reader: ProgressReader | None = None
        self._run: tuple[int, int] | None = None
        self._sdk = False
        self._pending: Sighting | None = None
        self._sent_s = float("-inf")
        self._sent_step: int | None = None
        self._reached = -1  # the highest step an earlier run reached
        self._urgent = False  # a run's first step, or its first beyond `_reached`
        self._noted = False
        self._hinted = False

    def sdk_reported(self) -> None:
        """The training code reports its steps itself: the output is not read any more."""
        self._sdk = True
        self._pending = None

    def step_of(self, replica: str) -> int | None:
        """The step the current run of `replica` printed last (None: none read)."""
        reader = self.reader
        if replica != self.source or reader is None or self._sdk:
            return None
        return reader.step

    def reads(self, replica: str) -> bool:
        """Whether `feed` would read `replica`'s output now."""
        return self.enabled and not self._sdk and replica == self.source

    def feed(self, ev: ReplicaOutput) -> None:
        """A current run's output (the master drops a run that is not current)."""
        if not self.reads(ev.replica):
            return
        run = (ev.attempt, ev.restart)
        if self.reader is None or run != self._run:
            self.flush()
            if self.reader is not None and self.reader.step is not None:
                self._reached = max(self._reached, self.reader.step)
            self.reader, self._run = ProgressReader(self.pattern), run
            self._sent_s = float("-inf")  # where the new run starts counts at once
        reader = self.reader
        for segment in ev.segments:
            if (seen := reader.read(segment)) is None or seen.step is None:
                continue
            if self._pending is not None and self._urgent:
                self.flush()  # goodput needs when it passed the old run's last step
            self._pending = seen
            self._urgent = seen.step > self._reached >= 0 and not self._passed()
        if reader.off is not None and not self._noted:
            self._noted = True
            self.note(ev.replica, f"progress from output: {reader.off}")
        if reader.hint is not None and not self._hinted and self.later is not None:
            self._hinted = True  # said only if no step comes meanwhile
            self.later(HINT_AFTER_S, lambda: self._hint(reader, ev.replica))
        if self._pending is None:
            return
        if self._urgent or ev.time_s - self._sent_s >= self.every_s:
            self._sent_s = ev.time_s
            self.flush()
        elif self.later is not None and not self._flush_due:
            self._flush_due = True
            self.later(self.every_s, self._due)

    def _hint(self, reader: ProgressReader, replica: str) -> None:
        if reader is self.reader and reader.step is None and reader.hint and not self._sdk:
            self.note(replica, f"no progress in the output: {reader.hint}")

    def _passed(self) -> bool:
        return self._sent_step is not None and self._sent_step > self._reached

    def _due(self) -> None:
        self._flush_due = False
        self.flush()

    def flush(self) -> None:
        """Forward the sighting held back by the rate limit (a run ended, the job ends)."""
        seen, self._pending, self._urgent = self._pending, None, False
        if seen is None or seen.step is None or self._sdk:
            return
        if seen.step == self._sent_step and not seen.metrics:
            return
        self._sent_step = seen.step
        metrics: dict[str, object] = {**seen.metrics, "progress_from": seen.source}
        self.forward(self.source, seen.step, metrics)
