"""`trainguard validate`: the spec `run` would start, checked and said, nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli.main import main


def test_a_spec_and_flags_are_said_in_one_line_and_nothing_is_stored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: resnet\nworker_pools: [{replicas: 4, command: [python, t.py]}]\n")
    assert main(["validate", "-f", str(spec), "--max-restarts", "5"]) == 0
    assert capsys.readouterr().out == (
        "ok: job resnet: 4 replica(s) in 1 pool(s), framework pytorch, backend local\n"
    )
    assert main(["validate", "--nproc_per_node", "2", "train.py", "--lr", "1"]) == 0
    assert "ok: job train: 2 replica(s)" in capsys.readouterr().out
    assert main(["validate", "-f", str(spec), "--max-restarts", "5", "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["fault_tolerance"]["max_num_of_job_restart"] == 5
    assert list(tmp_path.iterdir()) == [spec]  # no store, no home


def test_a_bad_spec_is_one_line_per_problem_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\nworker_pools: [{replicas: -1, command: [a]}]\n")
    assert main(["validate", "-f", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err == "trainguard: worker_pools[0].replicas: must be >= 1, got -1\n"
