"""The tail of a replica's output, and how to read it: bounded, prefix-free, traceback-aware."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable

TAIL_LINES = 200
TAIL_BYTES = 64 * 1024
MAX_LINE = 4096

# What launchers and log shippers put before a line: "[rank3]: ", "[default0]:",
# "[trainer0|0]:", srun -l's "11: ", mpirun's "[1,25]<stderr>:", Ray's "(pid=1926) " and
# "(RayTrainWorker pid=42, ip=10.0.0.1) ", a leading timestamp: a prefix-free view.
_PREFIX = re.compile(
    r"^(\s*(\[[\w.:|-]+\]:|\[\d+,\d+\]<std(?:out|err)>:|\d{1,5}: |"
    r"\((\w+ )?pid=\d+(, ip=[\d.]+)?\)|【[^】]*】|\d{4}-\d\d-\d\dT[\d:.]+Z? \|)\s?)+"
)
_EXC_LINE = re.compile(
    r"^([A-Za-z_]\w*\.)*(Exception|_*[A-Z]\w*(Error|Exception|Interrupt|Exit|Group))(:.*)?$"
)
# Lines that chain one traceback to the next: the cause comes first.
_CHAINS = (
    "During handling of the above exception, another exception occurred",
    "The above exception was the direct cause of the following exception",
)


class Tail:
    """The last lines of an output stream, bounded both in lines and in bytes."""

    def __init__(self, max_lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> None:
        self._lines: deque[str] = deque()
        self._bytes = 0
        self._max_lines = max_lines
        self._max_bytes = max_bytes

    def append(self, line: str) -> None:
        line = line[:MAX_LINE]
        self._lines.append(line)
        self._bytes += len(line) + 1
        while len(self._lines) > self._max_lines or self._bytes > self._max_bytes:
            self._bytes -= len(self._lines.popleft()) + 1

    def lines(self) -> tuple[str, ...]:
        return tuple(self._lines)


def clean(line: str) -> str:
    """One log line without launcher prefixes or exception-group rails."""
    return _PREFIX.sub("", line).strip().lstrip("|+ ").strip()


def exception_block(lines: Iterable[str]) -> tuple[int, int, list[str]] | None:
    """(chain start, exception index, lines) of the last Python traceback in a tail.

    The chain start is the first traceback of the last chain ("During handling of the
    above exception..."), where the original cause is told.

    The block is the `KeyError: 'x'` line and the lines of its message that follow it,
    up to the next blank line or the end (an exception message may span lines).
    """
    cleaned = [clean(x) for x in lines]
    start: int | None = None
    found: int | None = None
    chained = False
    for i, line in enumerate(cleaned):
        if line.startswith(_CHAINS):
            chained = True
        elif "Traceback (most recent call last)" in line:
            if not chained:
                start = i  # a new chain; a chained traceback keeps its cause's start
            found, chained = None, False
        elif start is not None and found is None and _EXC_LINE.match(line):
            found = i
    if found is None:
        return None
    block = [cleaned[found]]
    for line in cleaned[found + 1 : found + 12]:
        if not line or "Traceback (most recent call last)" in line:
            break
        block.append(line)
    assert start is not None
    return start, found, block


def last_exception(lines: Iterable[str]) -> str | None:
    """The `KeyError: 'x'` line closing the last Python traceback in a log tail."""
    hit = exception_block(lines)
    return hit[2][0] if hit else None
