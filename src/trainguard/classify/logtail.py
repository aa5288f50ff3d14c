"""The tail of a replica's output, and how to read it: bounded, prefix-free, traceback-aware."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence

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
# A traceback's frame line, `File "train.py", line 8, in main` once cleaned (faulthandler's
# "line 8 in main" has no comma): it opens a traceback whose header line was lost.
_FRAME = re.compile(r'^File "[^"]*", line \d+, in ')
_HEADER = "Traceback (most recent call last)"
# Lines that chain one traceback to the next: the cause comes first.
_CHAINS = (
    "During handling of the above exception, another exception occurred",
    "The above exception was the direct cause of the following exception",
)
# What a terminal obeys rather than shows: C0 and C1 controls but newline and tab (ESC
# starts a title change or a screen clear; CSI is one byte in C1), DEL, bidi overrides.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character written as its escape (ESC as `\\x1b`).

    Replica output and what is made of it (error messages, matched lines, stacks) is
    shown on terminals: it must be seen there, never obeyed.
    """
    return _CONTROL.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


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


def may_end_in_traceback(lines: Sequence[str], after: int) -> bool:
    """Whether a traceback's exception line may be among the last `after` + 1 lines: its
    last frame (`File "..."`, its code and caret lines) is right above it. A test of a few
    lines before `exception_block` reads a whole tail: a stop of 1,024 ranks reads 1,024."""
    return any(_HEADER in x or 'File "' in x for x in lines[-(after + 6) :])


def exception_block(lines: Iterable[str]) -> tuple[int, int, list[str]] | None:
    """(chain start, exception index, lines) of the last Python traceback in a tail.

    The chain start is the first traceback of the last chain ("During handling of the
    above exception..."), where the original cause is told.

    A frame line outside a traceback opens one whose header was lost: glued to the end
    of an over-long line, whose cut (MAX_LINE) kept only its start. Frames that no
    exception line follows were a printed stack (traceback.print_stack), not a traceback.

    The block is the `KeyError: 'x'` line and the lines of its message that follow it,
    up to the next blank line or the end (an exception message may span lines).
    """
    raw = list(lines)
    if not any(_HEADER in x or 'File "' in x for x in raw):
        return None  # no traceback starts anywhere (most tails: a stop reads 1,024 of them)
    cleaned = [clean(x) for x in raw]
    start: int | None = None
    found: int | None = None
    before: tuple[int, int] | None = None  # the last traceback found, if frames follow it
    headless = chained = False
    for i, line in enumerate(cleaned):
        if line.startswith(_CHAINS):
            chained = True
        elif _HEADER in line or (_FRAME.match(line) and (start is None or found is not None)):
            if start is not None and found is not None:
                before = start, found
            if not chained:
                start = i  # a new chain; a chained traceback keeps its cause's start
            found, chained, headless = None, False, _HEADER not in line
        elif start is not None and found is None and _EXC_LINE.match(line):
            found = i
    if found is None and headless and before is not None:
        start, found = before
    if found is None:
        return None
    block = [cleaned[found]]
    for line in cleaned[found + 1 : found + 12]:
        if not line or _HEADER in line:
            break
        block.append(line)
    assert start is not None
    return start, found, block
