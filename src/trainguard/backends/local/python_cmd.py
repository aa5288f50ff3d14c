"""What a replica's command asks Python to run, read as the interpreter reads its argv.

The warm-start zygote can run a replica only as the interpreter would have: the same
program (a script, `-m module` or `-c code`), the same `sys.argv`, and no interpreter
flag it cannot honour after the fact. `parse` says which, or why not (the record keeps
the reason and the replica starts cold). Pure: no process, no import of the target.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

_HONOURED = frozenset("uB")
"""Flags a forked child can honour: -u (unbuffered output) and -B (no .pyc writes)."""
_WITH_VALUE = frozenset("WX")
"""Flags that take a value (`-W error`, `-X dev`): they change the interpreter itself."""


@dataclass(frozen=True)
class PythonCommand:
    mode: Literal["script", "module", "code"]
    target: str  # the script's path, the module's name, or the code
    args: tuple[str, ...]  # what follows it: sys.argv[1:]
    unbuffered: bool = False  # -u
    no_bytecode: bool = False  # -B

    @property
    def argv0(self) -> str:
        """sys.argv[0] as the interpreter sets it (`-m` fills in the module's file later)."""
        return {"script": self.target, "module": self.target, "code": "-c"}[self.mode]


def is_this_python(program: str) -> bool:
    """`python`, `python3`, or a path to the interpreter trainguard runs on."""
    if program in ("python", "python3"):
        return True
    with contextlib.suppress(OSError):
        return os.path.realpath(program) == os.path.realpath(sys.executable)
    return False


def parse(argv: Sequence[str]) -> PythonCommand | str:
    """The command as Python would run it, or why a fork could not run it the same way."""
    if not argv or not is_this_python(argv[0]):
        return "not this Python interpreter"
    flags: set[str] = set()
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-" or not arg.startswith("-"):
            break
        if arg == "--":
            i += 1
            break
        letters = arg[1:]
        for j, letter in enumerate(letters):
            if letter in "mc":
                rest = letters[j + 1 :]
                if rest:
                    target, tail = rest, argv[i + 1 :]
                elif i + 1 < len(argv):
                    target, tail = argv[i + 1], argv[i + 2 :]
                else:
                    return f"-{letter} without its argument"
                mode: Literal["module", "code"] = "module" if letter == "m" else "code"
                return _made(mode, target, tail, flags)
            if letter in _WITH_VALUE or letter not in _HONOURED:
                return f"interpreter flag -{letter} changes the interpreter itself"
            flags.add(letter)
        i += 1
    if i >= len(argv):
        return "no script: an interactive interpreter"
    if argv[i] == "-":
        return "a script read from stdin"
    return _made("script", argv[i], argv[i + 1 :], flags)


def _made(
    mode: Literal["script", "module", "code"], target: str, tail: Sequence[str], flags: set[str]
) -> PythonCommand:
    return PythonCommand(mode, target, tuple(tail), "u" in flags, "B" in flags)
