"""A backend that cannot run from here is refused before anything is stored (issue 37):
`--backend slurm` outside an allocation, `--backend ray` where `import ray` fails. One
line, exit 2, no job; never a traceback, an INTERRUPTED job or attempts of an internal
error."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest
from conftest import TG

from trainguard.backends.preflight import backend_problem
from trainguard.cli.main import main


def _jobs_stored(home: Path) -> int:
    db = home / "trainguard.db"
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("select name from sqlite_master")}
        return (
            int(con.execute("select count(*) from jobs").fetchone()[0]) if "jobs" in tables else 0
        )
    finally:
        con.close()


def test_slurm_needs_an_allocation() -> None:
    assert backend_problem("slurm", {}) is not None
    assert "SLURM_JOB_ID" in (backend_problem("slurm", {}) or "")
    inside = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[0-2]"}
    assert backend_problem("slurm", inside) is None
    assert backend_problem("local", {}) is None


def test_ray_that_does_not_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    problem = backend_problem("ray")
    assert problem is not None and "pip install trainguard[ray]" in problem


@pytest.mark.parametrize("backend", ["slurm", "ray"])
def test_run_refuses_in_one_line_and_stores_nothing(
    backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)
    home = tmp_path / "home"
    code = main(["--home", str(home), "run", "--backend", backend, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert ("allocation" if backend == "slurm" else "pip install trainguard[ray]") in err
    assert _jobs_stored(home) == 0


@pytest.mark.slow
def test_the_cli_refuses_ray_with_a_python_that_cannot_import_it(tg: TG, tmp_path: Path) -> None:
    """A real `trainguard` process whose `ray` is a package that raises ImportError."""
    stub = tmp_path / "stub" / "ray"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no ray in this python (a stub)')\n")
    tg.env["PYTHONPATH"] = str(stub.parent)
    res = tg("run", "--backend", "ray", "--", "true", timeout=60)
    assert res.returncode == 2, res.stderr
    line = "trainguard: backend ray needs Ray, and `import ray` fails here"
    assert res.stderr.startswith(line) and res.stderr.count("\n") == 1, res.stderr
    assert "pip install trainguard[ray]" in res.stderr
    assert _jobs_stored(tg.home) == 0


@pytest.mark.slow
def test_the_cli_refuses_slurm_outside_an_allocation(tg: TG) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        tg.env.pop(var, None)
    res = tg("run", "--backend", "slurm", "--", "true", timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "runs inside an allocation" in res.stderr
    assert _jobs_stored(tg.home) == 0
