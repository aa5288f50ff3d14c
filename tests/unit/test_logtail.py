"""The last exception of a log tail (the first line of logtail.exception_block): the line
a Python traceback ends with, through chained, caused and grouped exceptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.backends.output import RunOutput
from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.classify.logtail import exception_block


def last_exception(lines: tuple[str, ...]) -> str | None:
    """The `KeyError: 'x'` line closing the last Python traceback in a log tail."""
    hit = exception_block(lines)
    return hit[2][0] if hit else None


CHAINED = (
    "Traceback (most recent call last):",
    '  File "a.py", line 3, in <module>',
    "KeyError: 'x'",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    '  File "a.py", line 5, in <module>',
    "ValueError: bad value",
)

CAUSED = (
    "Traceback (most recent call last):",
    '  File "a.py", line 3, in <module>',
    "OSError: [Errno 2] No such file or directory: 'data.bin'",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "Traceback (most recent call last):",
    '  File "a.py", line 5, in <module>',
    "RuntimeError: cannot load the dataset",
)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            (
                "step 10 loss 0.5",
                "Traceback (most recent call last):",
                '  File "/app/train.py", line 8, in main',
                "    batch = cfg['x']",
                "            ~~~^^^^^",
                "KeyError: 'x'",
            ),
            "KeyError: 'x'",
        ),
        (CHAINED, "ValueError: bad value"),
        (CAUSED, "RuntimeError: cannot load the dataset"),
        (
            (
                "Traceback (most recent call last):",
                '  File "train.py", line 40, in step',
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            ),
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        (
            (
                "Traceback (most recent call last):",
                "torch.distributed.DistBackendError: NCCL error in: ...",
            ),
            "torch.distributed.DistBackendError: NCCL error in: ...",
        ),
        (
            ("Traceback (most recent call last):", '  File "a.py", line 1', "KeyboardInterrupt"),
            "KeyboardInterrupt",
        ),
        (
            ("Traceback (most recent call last):", '  File "a.py", line 1', "SystemExit: 3"),
            "SystemExit: 3",
        ),
        (
            ("Traceback (most recent call last):", "__main__.ConfigError: missing lr"),
            "__main__.ConfigError: missing lr",
        ),
        # Two separate tracebacks: the last one wins.
        (
            (
                "Traceback (most recent call last):",
                "KeyError: 'first'",
                "retrying",
                "Traceback (most recent call last):",
                "IndexError: list index out of range",
            ),
            "IndexError: list index out of range",
        ),
        # Leading whitespace (indented logs) is tolerated.
        (("  Traceback (most recent call last):", "    KeyError: 'x'"), "KeyError: 'x'"),
        # Exception-looking lines with no Traceback header before them are ignored.
        (("ValueError: printed by the program", "RuntimeError: also printed"), None),
        (("RuntimeError: before the traceback", "Traceback (most recent call last):"), None),
        # A new traceback whose exception line has not arrived yet forgets the older one.
        (
            (
                "Traceback (most recent call last):",
                "KeyError: 'x'",
                "Traceback (most recent call last):",
                '  File "a.py", line 1',
            ),
            None,
        ),
        # Source lines inside a traceback are not exception lines.
        (
            (
                "Traceback (most recent call last):",
                '  File "a.py", line 1, in <module>',
                "    raise ValueError('bad')",
            ),
            None,
        ),
        ((), None),
    ],
)
def test_last_exception(lines: tuple[str, ...], expected: str | None) -> None:
    assert last_exception(lines) == expected


def test_last_exception_bare_exception_class() -> None:
    lines = ("Traceback (most recent call last):", '  File "a.py", line 1', "Exception: boom")
    assert last_exception(lines) == "Exception: boom"


def test_last_exception_inside_an_exception_group() -> None:
    lines = (
        "  + Exception Group Traceback (most recent call last):",
        '  |   File "a.py", line 3, in <module>',
        "  | ExceptionGroup: many (1 sub-exception)",
        "  +-+---------------- 1 ----------------",
        "    | Traceback (most recent call last):",
        '    |   File "a.py", line 2, in f',
        "    | ValueError: bad shape",
        "    +------------------------------------",
    )
    assert last_exception(lines) == "ValueError: bad shape"


def test_headerless_frames_open_a_traceback_unless_no_exception_follows() -> None:
    frames = ('  File "a.py", line 3, in <module>', "    main()")
    assert last_exception(("xxxx", *frames, "RuntimeError: boom")) == "RuntimeError: boom"
    # after a traceback, frames with no exception line were a printed stack
    first = ("Traceback (most recent call last):", *frames, "KeyError: 'x'")
    assert last_exception((*first, "retrying", *frames)) == "KeyError: 'x'"
    assert last_exception((*first, *frames, "ValueError: v")) == "ValueError: v"
    # faulthandler's frames ("line 3 in f", no comma) open nothing
    assert last_exception(('  File "a.py", line 3 in f', "ValueError: v")) is None


def test_a_traceback_glued_to_an_over_long_line_is_still_read(tmp_path: Path) -> None:
    """A replica prints 1 MB with no newline, then dies: Python's traceback header is
    glued to the end of the long line, and the cut of over-long lines drops it."""
    out = RunOutput("worker-0", tmp_path / "w0.log", None, lambda first, segments: None)
    data = b"x" * 1_000_000 + (
        b"Traceback (most recent call last):\n"
        b'  File "/app/train.py", line 4, in <module>\n'
        b'    raise RuntimeError("boom")\n'
        b"RuntimeError: boom\n"
    )
    for at in range(0, len(data), 65536):  # as a pipe delivers it
        out.feed(data[at : at + 65536])
    out.close()
    tail = out.tail.lines()
    assert not any("Traceback" in line for line in tail)  # the header is gone...
    assert last_exception(tail) == "RuntimeError: boom"  # ...the error is not
    c = classify_exit(ExitEvidence("worker-0", 1, log_tail=tail))
    assert c.matched_line == "RuntimeError: boom"
    assert c.message.endswith("Termination reason: RuntimeError: boom.")
