"""The Ray Train port path: `trainguard.train` and the example that uses it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TG

from trainguard import train
from trainguard.train import Checkpoint


def test_context_reads_the_replica_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
    }.items():
        monkeypatch.setenv(key, value)
    ctx = train.get_context()
    assert (ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()) == (3, 8, 1)
    assert ctx.get_node_rank() == 1


def test_checkpoint_as_and_to_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_text("w")
    checkpoint = Checkpoint.from_directory(src)
    with checkpoint.as_directory() as d:
        assert Path(d, "w.bin").read_text() == "w"
    copy = checkpoint.to_directory(tmp_path / "copy")
    assert Path(copy, "w.bin").read_text() == "w"


def _digest(tg: TG) -> str:
    log = tg("logs", "ray_train_port").stdout
    found = re.search(r"final weights sha256 ([0-9a-f]{64})", log)
    assert found, log
    return found[1]


@pytest.mark.slow
def test_the_ported_loop_resumes_from_its_checkpoint_and_loses_nothing(tmp_path: Path) -> None:
    argv = ("--", sys.executable, str(ROOT / "examples" / "ray_train_port.py"), "--epochs", "20")
    clean, faulty = TG(tmp_path / "clean"), TG(tmp_path / "faulty")
    assert clean("run", "--quiet", "--nproc", "2", *argv, timeout=300).returncode == 0
    inject = ("--inject", "signal:worker-1:SIGKILL@step=8")
    res = faulty("run", "--quiet", "--nproc", "2", *inject, *argv, timeout=300)
    assert res.returncode == 0, res.stderr
    assert faulty.only_job()["attempts"] == 2
    assert "resumed from" in faulty("logs", "ray_train_port").stdout
    assert _digest(faulty) == _digest(clean)
