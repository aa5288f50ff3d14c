"""One replica run's output as the master keeps it: a log file, a tail, the terminal tee.

Both backends feed it the bytes a replica printed, as they arrive: locally from a pipe,
on Ray from the actor that runs the replica on its node.

Its segments (for progress read from the output) are a bounded sample: this runs on the
path of the replica's output, and a replica waits in write() while it does, so reading
every line of a chatty one held it back 6-20x (issue 37). Up to `SAMPLE_BYTES_S` bytes a
second (a burst of `SAMPLE_BURST`) every segment is read; beyond, the newest segments of
each chunk that fit the budget, never part of one.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

from trainguard.classify.logtail import MAX_LINE, Tail
from trainguard.storage.private import append_private

LOG_RETRY_S = 5.0
"""How often a log that could not be written is tried again (a disk that filled up)."""

SAMPLE_BYTES_S = 256 * 1024
"""Bytes of segments a second that progress reading looks at, at most (see above)."""
SAMPLE_BURST = 256 * 1024
"""...and at once, after a quiet spell: a trainer's output at its usual pace is all read."""

_warned: set[str] = set()
_SEGMENT_END = re.compile(rb"[\r\n]")


def warn_once(text: str) -> None:
    """One line on stderr per distinct problem, not one per chunk of output."""
    key = text.split(" (", 1)[0]
    if key not in _warned:
        _warned.add(key)
        with contextlib.suppress(OSError, ValueError):
            print(text, file=sys.stderr, flush=True)


class RunOutput:
    def __init__(
        self,
        replica: str,
        log_path: Path,
        tee: TextIO | None,
        on_output: Callable[[bool, tuple[str, ...]], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_output(first, segments)` is told of every chunk; `first` is True once, for
        the first; `segments` are the lines it completed, each carriage-return update of a
        progress bar apart (a bar on a pipe ends no line until it closes), as far as the
        sample's budget goes (see above)."""
        self.replica = replica
        self.log_path = log_path
        self.log: BinaryIO | None = None
        self._lost = 0  # bytes not written to the log while it could not be written
        self._retry_at = 0.0
        self._open_log()
        self.tail = Tail()
        self._tee = tee
        self._on_output = on_output
        self._partial = b""
        self._segment = b""
        self._seen = False
        self.last_s = 0.0  # when it last printed (wall clock; 0: not yet)
        self._clock = clock
        self._budget = float(SAMPLE_BURST)  # bytes of segments it may read now
        self._budget_s = clock()

    def _open_log(self) -> None:
        try:
            self.log = append_private(self.log_path, buffering=0)  # 0600 in 0700 folders
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        """A full disk (or a gone folder) must not stop the supervision: log less, go on."""
        self._retry_at = time.monotonic() + LOG_RETRY_S
        warn_once(
            f"trainguard: cannot write replica logs under {self.log_path.parent} "
            f"({exc.strerror or exc}); supervising on, output kept in memory tails only, "
            f"retrying every {LOG_RETRY_S:g} s"
        )

    def _write(self, data: bytes) -> None:
        if self.log is None:
            if time.monotonic() < self._retry_at:
                self._lost += len(data)
                return
            self._open_log()
            if self.log is None:
                self._lost += len(data)
                return
        try:
            if self._lost:
                note = f"\n[trainguard: {self._lost} bytes of output not written here]\n"
                self.log.write(note.encode())
                self._lost = 0
            self.log.write(data)
        except OSError as exc:
            self._lost += len(data)
            with contextlib.suppress(OSError):
                self.log.close()
            self.log = None
            self._failed(exc)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self._write(data)
        self.last_s = time.time()
        first, self._seen = not self._seen, True
        self._on_output(first, self._segments(data))
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            lines.append(self._partial)
            self._partial = b""
        self._take(lines)

    def _segments(self, data: bytes, sample: bool = True) -> tuple[str, ...]:
        """The segments `data` completes: the newest that fit the budget (all: `sample`
        False), each cut at MAX_LINE. Work in proportion to what is read, not to `data`."""
        buf = self._segment + data
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r"))  # -1: no segment ends here
        self._segment = buf[cut + 1 :]
        over = b""
        if len(self._segment) > MAX_LINE:  # an endless line counts as one, cut
            over, self._segment = self._segment, b""
        if not sample:
            return _texts([*_SEGMENT_END.split(buf[:cut]), over] if cut >= 0 else [over])
        now = self._clock()
        budget = min(SAMPLE_BURST, self._budget + (now - self._budget_s) * SAMPLE_BYTES_S)
        self._budget_s = now
        parts: list[bytes] = []
        if over and budget >= MAX_LINE:
            budget -= MAX_LINE
            parts.append(over)
        if cut >= 0:
            start = max(0, cut - int(budget))
            if start > 0 and buf[start - 1 : start] not in (b"\n", b"\r"):
                # a segment the budget cuts is not read at all (nor charged: it adds up)
                m = _SEGMENT_END.search(buf, start, cut)
                start = cut + 1 if m is None else m.end()
            if start <= cut:
                parts[:0] = _SEGMENT_END.split(buf[start:cut])
                budget -= cut - start
        self._budget = max(0.0, budget)
        return _texts(parts)

    def end(self) -> None:
        """No more output: the last line without a newline still counts."""
        if self._segment.strip():
            self._on_output(False, self._segments(b"\n", sample=False))
        if self._partial:
            self._take([self._partial])
            self._partial = b""

    def close(self) -> None:
        self.end()
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.close()

    def _take(self, lines: list[bytes]) -> None:
        out: list[str] = []
        for raw in lines:
            text = raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r")
            self.tail.append(text)
            if self._tee is not None:
                out.append(f"[{self.replica}]: {text}\n")
        if out and self._tee is not None:
            with contextlib.suppress(OSError, ValueError):
                self._tee.write("".join(out))
                self._tee.flush()


def _texts(parts: list[bytes]) -> tuple[str, ...]:
    return tuple(text for p in parts if (text := p[:MAX_LINE].decode("utf-8", "replace").strip()))
