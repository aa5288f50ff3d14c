"""What a replica's command asks Python to run, read as the interpreter reads its argv.

The warm-start zygote can run a replica only as the interpreter would have: the same
program (a script, `-m module` or `-c code`), the same `sys.argv`, and no interpreter
flag it cannot honour after the fact. `parse` says which, or why not (the record keeps
the reason and the replica starts cold). No process and no import of the target; a bare
`python` is looked up on the replica's PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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


HONOURED_ENV = frozenset({"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER"})
"""Interpreter variables a forked child applies itself; every other PYTHON* variable is
read once, when an interpreter starts, and must be the same as the zygote's."""


def startup_env_differs(zygote_env: Mapping[str, str], env: Mapping[str, str]) -> str | None:
    """The interpreter variable (PYTHONPATH, PYTHONHASHSEED, ...) that `env` sets otherwise
    than the zygote started with, if any: a fork cannot change it."""
    names = {k for k in (*zygote_env, *env) if k.startswith("PYTHON")} - HONOURED_ENV
    for name in sorted(names):
        if zygote_env.get(name) != env.get(name):
            return f"{name} differs from the preload process's"
    return None


def _identity(path: str) -> tuple[str, str | None]:
    """An interpreter as its binary and its virtual environment: a venv's `bin/python` is a
    link to the system's, yet it imports other packages."""
    venv = Path(os.path.abspath(path)).parent.parent
    return os.path.realpath(path), str(venv) if (venv / "pyvenv.cfg").is_file() else None


def is_this_python(program: str, search_path: str | None = None) -> bool:
    """`program` (a path, or a name looked up on `search_path`, default $PATH) is the
    interpreter trainguard runs on, in the same virtual environment."""
    found = program if os.sep in program else shutil.which(program, path=search_path)
    if found is None:
        return False
    with contextlib.suppress(OSError):
        return _identity(found) == _identity(sys.executable)
    return False


def parse(argv: Sequence[str], search_path: str | None = None) -> PythonCommand | str:
    """The command as Python would run it, or why a fork could not run it the same way.

    `search_path` is the replica's PATH, where a bare `python` is looked up."""
    if not argv:
        return "no command"
    if not is_this_python(argv[0], search_path):
        return f"{argv[0]!r} is not the interpreter trainguard runs on ({sys.executable})"
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
