"""One replica run's output as the master keeps it: a log file, a tail, the terminal tee.

Both backends feed it the bytes a replica printed, as they arrive: locally from a pipe,
on Ray from the actor that runs the replica on its node.
"""

from __future__ import annotations

import contextlib
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO

from trainguard.policy.logtail import MAX_LINE, Tail

LOG_RETRY_S = 5.0
"""How often a log that could not be written is tried again (a disk that filled up)."""

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
    ) -> None:
        """`on_output(first, segments)` is told of every chunk; `first` is True once, for
        the first; `segments` are the lines it completed, each carriage-return update of a
        progress bar apart (a bar on a pipe ends no line until it closes)."""
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

    def _open_log(self) -> None:
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - see close()
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

    def _segments(self, data: bytes) -> tuple[str, ...]:
        parts = _SEGMENT_END.split(self._segment + data)
        self._segment = parts.pop()
        if len(self._segment) > MAX_LINE:
            parts.append(self._segment)
            self._segment = b""
        return tuple(
            text for p in parts if (text := p[:MAX_LINE].decode("utf-8", "replace").strip())
        )

    def end(self) -> None:
        """No more output: the last line without a newline still counts."""
        if self._segment.strip():
            self._on_output(False, self._segments(b"\n"))
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
