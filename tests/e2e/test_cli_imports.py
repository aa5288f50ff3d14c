"""The read commands (`jobs`, `status`, `records`, `explain`, `logs`, `goodput`, `stacks`)
start in about 0.3 s of CPU, not 0.55: they import the store and the tables, not the
job spec's models, the policy or the classifier's rules, which only `run`, `submit`,
`classify` and `nodes` need (measured with `python -X importtime`; the suite makes ~750
such calls)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_READ = """
import contextlib, io, json, sys
from trainguard.cli.main import main
home, job = sys.argv[1:]
codes = []
for argv in (["jobs"], ["status", job], ["records", job], ["explain", job],
             ["logs", job], ["goodput", job], ["stacks", job], ["jobs", "--json"]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        codes.append(main(["--home", home, *argv]))
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""

_HEAVY = (
    "pydantic",
    "yaml",
    "trainguard.spec.models",
    "trainguard.policy.decisions",
    "trainguard.classify.catalogue",
    "trainguard.records.nodes",
    "trainguard.service.config",
)


@pytest.mark.slow  # a fresh interpreter: its sys.modules is the point
def test_the_read_commands_import_no_spec_models_policy_or_rules(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    tg = [str(Path(sys.executable).with_name("trainguard")), "--home", home]
    ran = subprocess.run(
        [*tg, "run", "--quiet", "--job-name", "j", "--", sys.executable, "-c", "1"]
    )
    assert ran.returncode == 0
    out = subprocess.run(
        [sys.executable, "-c", _READ, home, "j"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["codes"] == [0] * 8
    assert [m for m in _HEAVY if m in got["modules"]] == []


@pytest.mark.slow
def test_run_still_builds_its_spec_flags(tmp_path: Path) -> None:
    """`run --help` shows the spec's flags (built only for run and submit)."""
    tg = str(Path(sys.executable).with_name("trainguard"))
    out = subprocess.run(
        [tg, "--home", str(tmp_path), "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--nproc-per-node" in out.stdout, out.stderr
