"""What to preload when the user does not name it (`auto`, the default; issue 16).

The heavy, fork-safe modules the replica's program imports when it is loaded, found by
reading source (nothing of the program is imported or run) and that this interpreter can
import: the program's own top-level imports, those of the modules beside it that it
imports (its own package), and torch for an installed package that requires torch
(Lightning, for one). Only modules known to start no thread at import and to read no
per-rank setting when imported are chosen (Lightning reads RANK at import, so it is
imported by each replica, after torch); the zygote checks again after importing them
and refuses to fork from a threaded process.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from trainguard.backends.local.python_cmd import PythonCommand, parse

AUTO = "auto"
"""The preload name that stands for what `detect` finds."""

SAFE = ("torch", "torchvision", "numpy", "scipy")
"""Heavy modules worth a zygote that import without starting threads (torch first: it
brings numpy along)."""

MAX_SOURCE = 2 * 2**20
"""A program file larger than this is not read (it is not a training script)."""

MAX_LOCAL_FILES = 64
"""How many of the program's own modules are read, at most, following its imports."""

MAX_REQUIRES_DEPTH = 3
"""How deep an installed package's requirements are followed to find torch."""


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


def _local_file(name: str, home: Path) -> Path | None:
    for path in (home / f"{name}.py", home / name / "__init__.py"):
        if path.is_file():
            return path
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace") if path.stat().st_size <= MAX_SOURCE else None
    except OSError:
        return None


def program_imports(source: str, home: Path | None) -> set[str]:
    """The top-level packages the program imports when loaded, following the imports of its
    own modules (files and packages in `home`, the directory Python puts first on sys.path)."""
    found = top_level_imports(source)
    if home is None:
        return found
    todo, seen = list(found), set[str]()
    while todo and len(seen) < MAX_LOCAL_FILES:
        name = todo.pop()
        path = _local_file(name, home)
        if name in seen or path is None:
            continue
        seen.add(name)
        text = _read(path)
        more = top_level_imports(text) if text is not None else set()
        todo += sorted(more - found)
        found |= more
    return found - seen  # a module of the program's own is not a library to preload


_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(dist: str) -> set[str]:
    """What an installed distribution requires unconditionally (extras left out)."""
    try:
        reqs = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    out = set()
    for req in reqs:
        match = _REQ_NAME.match(req)
        marker = req.partition(";")[2]
        if match and "extra" not in marker:
            out.add(_norm(match.group(1)))
    return out


def requires_torch(packages: Iterable[str]) -> bool:
    """Some installed distribution providing one of `packages` requires torch."""
    providers = importlib.metadata.packages_distributions()
    todo = {_norm(d) for p in packages if p != "torch" for d in providers.get(p, ())}
    seen: set[str] = set()
    for _ in range(MAX_REQUIRES_DEPTH):
        todo -= seen
        if not todo:
            return False
        seen |= todo
        nxt: set[str] = set()
        for dist in todo:
            nxt |= _requirements(dist)
        if "torch" in nxt:
            return True
        todo = nxt
    return False


def _home(cmd: PythonCommand, cwd: str) -> Path | None:
    """The directory Python puts first on sys.path for this command."""
    return Path(cwd, cmd.target).parent if cmd.mode == "script" else Path(cwd)


def detect(cmd: PythonCommand, cwd: str, safe: Sequence[str] = SAFE) -> list[str]:
    """The `safe` modules the program needs when loaded that this Python can import.

    A program whose source cannot be read gets torch when this Python has it: a training
    program that trainguard cannot read most likely imports it."""
    source = program_source(cmd, cwd)
    if source is None:
        wanted = {"torch"}
    else:
        wanted = program_imports(source, _home(cmd, cwd))
        if "torch" in safe and "torch" not in wanted and requires_torch(wanted):
            wanted.add("torch")
    return [m for m in safe if m in wanted and importlib.util.find_spec(m) is not None]


def resolve(
    names: Sequence[str], argv: Sequence[str], cwd: str, search_path: str | None = None
) -> list[str]:
    """The preload list with `auto` replaced by what the first replica's program needs."""
    if AUTO not in names:
        return list(names)
    cmd = parse(argv, search_path)
    found = detect(cmd, cwd) if isinstance(cmd, PythonCommand) else []
    out: list[str] = []
    for name in names:
        for mod in found if name == AUTO else [name]:
            if mod not in out:
                out.append(mod)
    return out
