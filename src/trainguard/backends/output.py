"""One replica run's output as the master keeps it: a log file, a tail, the terminal tee.

Both backends feed it the bytes a replica printed, as they arrive: locally from a pipe,
on Ray from the actor that runs the replica on its node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from trainguard.logtail import MAX_LINE, Tail


class RunOutput:
    def __init__(
        self,
        replica: str,
        log_path: Path,
        tee: TextIO | None,
        on_output: Callable[[bool], None],
    ) -> None:
        """`on_output(first)` is told of every chunk; `first` is True once, for the first."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.replica = replica
        self.log = open(log_path, "ab", buffering=0)  # noqa: SIM115 - closed by close()
        self.tail = Tail()
        self._tee = tee
        self._on_output = on_output
        self._partial = b""
        self._seen = False

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.log.write(data)
        first, self._seen = not self._seen, True
        self._on_output(first)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            lines.append(self._partial)
            self._partial = b""
        self._take(lines)

    def end(self) -> None:
        """No more output: the last line without a newline still counts."""
        if self._partial:
            self._take([self._partial])
            self._partial = b""

    def close(self) -> None:
        self.end()
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
