"""The package's layers (issue 15): each subpackage imports only from the layers below it.

Every `import trainguard...` in `src/trainguard` counts, at module level or inside a
function or an `if TYPE_CHECKING:` block alike, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from conftest import ROOT

SRC = ROOT / "src" / "trainguard"
LAYERS: tuple[str | tuple[str, ...], ...] = (
    ("errors", "states", "signals", "timers"),  # the vocabulary: exceptions, states, signals, time
    "storage",  # files the SDK and the master share, standard library only (see below)
    "spec",
    "classify",  # what a failure is: catalogue, evidence, learned model, log and machine readings
    "policy",
    "frameworks",
    "hangs",
    "backends",
    "notify",
    "records",
    "master",
    "service",
    "cli",
)
# Outside the layers: what training code imports (the SDK, the Ray Train and AIMaster ports) and the
# entry points. They may import any layer; no layer imports them.
ENTRY = frozenset({"sdk", "aimaster", "train", "__main__", "__init__"})


def _layer(module: str) -> str:
    """`trainguard.classify.exits` -> `classify`; `trainguard` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _names(level: str | tuple[str, ...]) -> tuple[str, ...]:
    return level if isinstance(level, tuple) else (level,)


def _level(layer: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if layer in _names(names))


def _ours(module: str) -> bool:
    return module.split(".")[0] == "trainguard"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every trainguard import in the file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            out += [(node.lineno, n) for n in names[:1] if n.split(".")[0] == "trainguard"]
        elif isinstance(node, ast.Import):
            out += [
                (node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "trainguard"
            ]
    return out


def violations(src: Path = SRC) -> list[str]:
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        me = _layer(".".join(rel.parts))
        if me in ENTRY:
            continue
        assert any(me in _names(n) for n in LAYERS), f"{path}: in no layer; add it to LAYERS"
        for line, module in imports_of(path):
            other = _layer(module)
            if other == "__init__" and module == "trainguard":
                continue  # the version string
            if other in ENTRY or _level(other) > _level(me):
                found.append(f"{path.relative_to(src.parent)}:{line}: {me} imports {module}")
    return found


def test_every_layer_imports_only_from_below() -> None:
    assert violations() == []


def test_the_check_catches_a_wrong_import(tmp_path: Path) -> None:
    pkg = tmp_path / "trainguard"
    (pkg / "policy").mkdir(parents=True)
    (pkg / "policy" / "x.py").write_text(
        "def f():\n    from trainguard.master.loop import Master\n"
    )
    (pkg / "master").mkdir()
    (pkg / "master" / "loop.py").write_text("from trainguard.policy.x import f\n")
    assert violations(pkg) == ["trainguard/policy/x.py:2: policy imports trainguard.master.loop"]


@pytest.mark.parametrize(
    "name", sorted(p.name for p in SRC.iterdir() if p.is_dir() and p.name != "__pycache__")
)
def test_every_package_says_what_it_exports(name: str) -> None:
    if name in ("web",):
        return
    init = SRC / name / "__init__.py"
    assert init.is_file() and "__all__" in init.read_text(), init
    listed = _all_of(init)
    modules = {p.stem for p in (SRC / name).glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in (SRC / name).iterdir() if (p / "__init__.py").is_file()}
    if listed <= modules | {"web"}:  # a package that lists its modules lists them all
        assert listed == modules, f"{init}: __all__ misses {sorted(modules - listed)}"


def _all_of(init: Path) -> set[str]:
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return set(ast.literal_eval(node.value))
    return set()


# What `storage/` may import besides the standard library and the vocabulary: only inside a
# function, and only what the job that takes that path already needs (an fsspec URL for its
# checkpoints; torch for a snapshot of tensors, which the training process has loaded).
STORAGE_OPTIONAL = frozenset({"fsspec", "torch"})


def foreign_imports(src: Path = SRC) -> list[str]:
    """`storage/` imports that are neither the standard library nor trainguard's vocabulary
    (the layer check above keeps its trainguard imports at or below it)."""
    found = []
    for path in sorted((src / "storage").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                ok = root in sys.stdlib_module_names or root in ("__future__", "trainguard")
                if not ok and (id(node) in top or root not in STORAGE_OPTIONAL):
                    found.append(f"{path.relative_to(src.parent)}:{node.lineno}: {name}")
    return found


def test_storage_imports_only_the_standard_library() -> None:
    assert foreign_imports() == []


def test_the_storage_check_catches_a_foreign_import(tmp_path: Path) -> None:
    (tmp_path / "trainguard" / "storage").mkdir(parents=True)
    (tmp_path / "trainguard" / "storage" / "x.py").write_text(
        "import json\nimport fsspec\n\ndef f():\n    import torch\n    import yaml\n"
    )
    assert foreign_imports(tmp_path / "trainguard") == [
        "trainguard/storage/x.py:2: fsspec",
        "trainguard/storage/x.py:6: yaml",
    ]
