"""The queue under load (bench/queue_load.py, small): a real server, a quota of 4 and 30
jobs of a designed mix; every job ends in its expected state, none is lost, and never
more than 4 hold the quota at once. No wall-clock asserts: the bench's checks only."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT

BENCH = ROOT / "bench" / "queue_load.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("queue_load", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_queue_drains_with_every_job_in_its_expected_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench()
    argv = ["--jobs", "30", "--slots", "4", "--sleep", "0.2", "--timeout", "240"]
    rc = bench.main([*argv, "--home", str(tmp_path / "home")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "OK: every check passed" in out


def test_job_mix_is_deterministic_and_keeps_specials_behind_a_full_quota() -> None:
    bench = load_bench()
    kinds = bench.job_mix(30, 4)
    assert kinds == bench.job_mix(30, 4)
    assert kinds[:8] == ["ok"] * 8
    assert {k: kinds.count(k) for k in ("bug", "cancel", "expire")} == {
        "bug": 2,
        "cancel": 1,
        "expire": 1,
    }
    big = bench.job_mix(200, 8)
    assert {k: big.count(k) for k in ("bug", "cancel", "expire")} == {
        "bug": 10,
        "cancel": 6,
        "expire": 6,
    }


def test_peak_holding_counts_admission_to_end_and_releases_first_at_a_tie() -> None:
    bench = load_bench()

    def job(start: float, run: float, end: float) -> list[dict[str, object]]:
        return [
            {"from_state": None, "to_state": "QUEUED", "at_s": 0.0},
            {"from_state": "QUEUED", "to_state": "PENDING", "at_s": start},
            {"from_state": "PENDING", "to_state": "RUNNING", "at_s": run},
            {"from_state": "RUNNING", "to_state": "SUCCEEDED", "at_s": end},
        ]

    never = [
        {"from_state": None, "to_state": "QUEUED", "at_s": 0.0},
        {"from_state": "QUEUED", "to_state": "EXPIRED", "at_s": 5.0},
    ]
    histories = {"a": job(1, 2, 4), "b": job(2, 3, 5), "c": job(4, 4.5, 6), "d": never}
    peak, at_peak_s = bench.peak_holding(histories)
    assert peak == 2  # c is admitted at the instant a ends
    assert at_peak_s == pytest.approx(3.0)  # [2, 4] and [4, 5]
