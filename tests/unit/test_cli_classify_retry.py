"""`trainguard classify` says what the default policy does with a failure as a job's first
(issue 38): `retry`, `decision`, `why`, and takes `--progressed`. In-process, no child."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli.main import main
from trainguard.policy import outcome
from trainguard.spec.models import FaultTolerance

BUG = (  # at start-up: a bug that struck before any step is settled
    "Traceback (most recent call last):\n"
    '  File "train.py", line 41, in <module>\n'
    "    batch = batches[key]\n"
    "KeyError: 'labels'\n"
)
NCCL = (
    "[rank5]:[E611 03:22:41.118942510 ProcessGroupNCCL.cpp:616] [Rank 5] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=48211, OpType=ALLREDUCE, NumelIn=262144000, "
    "NumelOut=262144000, Timeout(ms)=600000) ran for 600046 milliseconds before timing out.\n"
    "[rank5]:[E611 03:22:41.119430011 ProcessGroupNCCL.cpp:636] [Rank 5] To avoid data "
    "inconsistency, we are taking the entire process down.\n"
)
SILENT = "loading the data\n"  # a bare exit 1: nothing the evidence settles


def _log(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "replica.log"
    path.write_text(text)
    return path


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["classify", *argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_bug_traceback_is_not_retried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, str(_log(tmp_path, BUG)), "--exit-code", "1", "--progressed", "no")
    assert (out["failure_class"], out["retryable"], out["uncertain"]) == (
        "user_error",
        False,
        False,
    )
    assert (out["retry"], out["decision"]) == (False, "FailJob")
    assert "not retryable (rule python-bug)" in out["why"]


def test_an_nccl_timeout_in_training_is_retried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _json(capsys, str(_log(tmp_path, NCCL)), "--signal", "SIGABRT", "--progressed", "yes")
    assert (out["failure_class"], out["retryable"]) == ("retryable_message", True)
    assert (out["retry"], out["decision"]) == (True, "RestartJob")
    assert "is retryable" in out["why"]


def test_an_uncertain_failure_follows_the_models_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = str(_log(tmp_path, SILENT))
    out = _json(capsys, log, "--exit-code", "1")
    assert out["uncertain"] and not out["retryable"]
    assert out["retry"] is FaultTolerance().retry_uncertain
    assert out["decision"] == ("RestartJob" if out["retry"] else "FailJob")

    # the default is read from the model, not restated: flip it there, the answer flips
    for flipped in (True, False):
        monkeypatch.setattr(
            outcome, "FaultTolerance", lambda f=flipped: FaultTolerance(retry_uncertain=f)
        )
        out = _json(capsys, log, "--exit-code", "1")
        assert out["retry"] is flipped, out["why"]


def test_progressed_sets_the_phase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = str(_log(tmp_path, NCCL))
    phases = {
        flag: _json(capsys, log, "--signal", "SIGABRT", *(["--progressed", flag] if flag else []))
        for flag in ("", "yes", "no")
    }
    assert {k: v["phase"] for k, v in phases.items()} == {
        "": "unknown",
        "yes": "training",
        "no": "startup",
    }
    # a timeout before any step trained reads as a setup problem, and is less sure
    assert phases["yes"]["confidence"] > phases["no"]["confidence"]


def test_plain_text_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(_log(tmp_path, BUG))]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("retry ")]
    assert len(lines) == 1 and lines[0].split()[1] == "no"
    assert "FailJob" in lines[0] and "python-bug" in lines[0]


def test_a_clean_exit_is_no_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, str(_log(tmp_path, SILENT)), "--exit-code", "0")
    assert (out["retry"], out["decision"]) == (False, None)
    assert main(["classify", str(_log(tmp_path, SILENT)), "--exit-code", "0"]) == 0
    assert "retry " not in capsys.readouterr().out


def test_a_bad_progressed_value_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["classify", str(_log(tmp_path, BUG)), "--progressed", "maybe"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--progressed: invalid choice: 'maybe'" in err[0]
    assert "Traceback" not in err[0]
