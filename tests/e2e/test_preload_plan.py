"""`--preload auto` (issue 16): what the program imports, read from its source, never run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TG

from trainguard.backends.local.preload_plan import (
    detect,
    program_imports,
    requires_torch,
    resolve,
    top_level_imports,
)
from trainguard.backends.local.python_cmd import PythonCommand

SOURCE = """
import os, json.decoder
from csv import reader
from . import sibling
try:
    import numpy
except ImportError:
    numpy = None
if True:
    with open(os.devnull):
        import sqlite3
def later():
    import wave
class K:
    import zlib
"""


def test_the_imports_a_module_runs_when_loaded() -> None:
    assert top_level_imports(SOURCE) == {"os", "json", "csv", "numpy", "sqlite3", "zlib"}
    assert top_level_imports("def (:") == set()


def test_detect_reads_scripts_modules_and_code(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import json\nimport csv\nimport os\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("import csv\n")
    safe = ("csv", "json", "wave")  # stand-ins for torch and numpy: importable everywhere
    cwd = str(tmp_path)
    assert detect(PythonCommand("script", "train.py", ()), cwd, safe) == ["csv", "json"]
    assert detect(PythonCommand("module", "train", ()), cwd, safe) == ["csv", "json"]
    assert detect(PythonCommand("module", "pkg", ()), cwd, safe) == ["csv"]
    assert detect(PythonCommand("code", "import wave", ()), cwd, safe) == ["wave"]
    assert detect(PythonCommand("script", "missing.py", ()), cwd, safe) == []
    assert detect(PythonCommand("module", "pkg.sub", ()), cwd, safe) == []  # never imported


def test_auto_is_replaced_and_named_modules_stay(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    argv = [sys.executable, "t.py"]
    assert resolve(["json"], argv, str(tmp_path)) == ["json"]
    assert resolve(["auto", "json"], argv, str(tmp_path)) == ["json"]  # t.py imports none
    assert resolve(["auto"], ["bash", "x.sh"], str(tmp_path)) == []


@pytest.mark.slow
def test_nothing_heavy_to_preload_starts_cold_and_quietly(tg: TG) -> None:
    res = tg("run", "--", sys.executable, "-c", "import json")
    assert res.returncode == 0, res.stderr
    assert "warm start" not in res.stderr and "cold" not in res.stderr
    assert "warm_start" not in tg("explain", tg.only_job()["id"]).stdout


@pytest.mark.slow
def test_auto_preloads_what_the_script_imports(tg: TG, tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    script = tmp_path / "t.py"
    script.write_text("import numpy\nprint(numpy.arange(3).sum())\n")
    res = tg("run", "--", sys.executable, str(script))  # auto: the default
    assert res.returncode == 0, res.stderr
    assert "warm start: numpy imported once" in res.stderr


def test_own_modules_are_followed_and_packages_needing_torch_bring_it(tmp_path: Path) -> None:
    """The script's own modules are read for their imports; an installed package that
    requires torch (Lightning) gets torch preloaded, not itself (it reads RANK on import)."""
    (tmp_path / "train.py").write_text("import model\nimport json\n")
    (tmp_path / "model.py").write_text("from helpers import x\nimport csv\n")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("import wave\nimport model\n")
    assert program_imports("import model\nimport json\n", tmp_path) == {"json", "csv", "wave"}
    safe = ("csv", "json", "wave", "zlib")
    assert detect(PythonCommand("script", "train.py", ()), str(tmp_path), safe) == [
        "csv",
        "json",
        "wave",
    ]
    assert not requires_torch({"json", "yaml"})
    pytest.importorskip("lightning")
    assert requires_torch({"lightning"})
    lit = PythonCommand("code", "import lightning", ())
    assert detect(lit, str(tmp_path)) == ["torch"]


def test_unreadable_program_gets_torch_when_it_is_there(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    assert detect(PythonCommand("script", "missing.py", ()), str(tmp_path)) == ["torch"]
