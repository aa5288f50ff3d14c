"""What to preload when the user does not name it (`--preload auto`, issue 16).

The heavy, fork-safe modules the replica's program imports at its top level, found by
reading its source (nothing of it is imported or run), and that this interpreter can
import. Only modules known to start no thread at import are chosen; the zygote checks
again after importing them and refuses to fork from a threaded process.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from pathlib import Path

from trainguard.backends.local.python_cmd import PythonCommand, parse

AUTO = "auto"
"""The preload name that stands for what `detect` finds."""

SAFE = ("torch", "torchvision", "numpy", "scipy")
"""Heavy modules worth a zygote that import without starting threads (torch first: it
brings numpy along)."""

MAX_SOURCE = 2 * 2**20
"""A program file larger than this is not read (it is not a training script)."""


def top_level_imports(source: str) -> set[str]:
    """The top-level package of every import the module runs when it is loaded: at module
    level, and inside module-level `if`/`try`/`with` blocks and class bodies (not inside
    functions)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.If | ast.Try | ast.TryStar | ast.With | ast.ClassDef):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    todo += child.body if isinstance(child, ast.ExceptHandler) else [child]
    return found


def program_source(cmd: PythonCommand, cwd: str) -> str | None:
    """The program's own source: the script, the module's file, or the `-c` code."""
    if cmd.mode == "code":
        return cmd.target
    path = Path(cwd, cmd.target) if cmd.mode == "script" else _module_file(cmd.target, cwd)
    try:
        if path is None or path.stat().st_size > MAX_SOURCE:
            return None
        return path.read_text(errors="replace")
    except OSError:
        return None


def _module_file(name: str, cwd: str) -> Path | None:
    """The file `python -m name` runs: from the working directory first, as -m does.

    Only a top-level name is looked up: finding a submodule would import its parents.
    """
    if "." in name:
        return None
    for path in (Path(cwd, f"{name}.py"), Path(cwd, name, "__main__.py")):
        if path.is_file():
            return path
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return None
    origin = Path(spec.origin)
    return origin.with_name("__main__.py") if origin.name == "__init__.py" else origin


def detect(cmd: PythonCommand, cwd: str, safe: Sequence[str] = SAFE) -> list[str]:
    """The `safe` modules the program imports at its top level that this Python can import."""
    source = program_source(cmd, cwd)
    wanted = top_level_imports(source) if source is not None else set()
    return [m for m in safe if m in wanted and importlib.util.find_spec(m) is not None]


def resolve(names: Sequence[str], argv: Sequence[str], cwd: str) -> list[str]:
    """The preload list with `auto` replaced by what the first replica's program needs."""
    if AUTO not in names:
        return list(names)
    cmd = parse(argv)
    found = detect(cmd, cwd) if isinstance(cmd, PythonCommand) else []
    out: list[str] = []
    for name in names:
        for mod in found if name == AUTO else [name]:
            if mod not in out:
                out.append(mod)
    return out
