"""`trainguard classify`, `explain` and `records --aggregate` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, TG, child

pytestmark = pytest.mark.slow  # every test here runs the real CLI

CORPUS = ROOT / "tests" / "corpus"


def test_classify_a_log_file_offline(tg: TG, tmp_path: Path) -> None:
    log = tmp_path / "w1.log"
    log.write_text(
        "step 7 loss 1.2\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "train.py", line 9, in <module>\n'
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    res = tg("classify", str(log), "--exit-code", "1", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["failure_class"], out["retryable"], out["rule"]) == (
        "device_oom",
        False,
        "cuda-oom",
    )
    assert out["matched_line"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert out["message"].startswith("The replica replica ran out of GPU memory")

    text = tg("classify", str(log), "--signal", "SIGKILL")
    assert "device_oom" in text.stdout  # OOM text explains a kill too

    keyword = tg("classify", str(CORPUS / "bug_silent_exit1.log"), "--retryable-error", "x")
    assert "user_error" in keyword.stdout


def test_classify_reports_bad_input_in_one_line(tg: TG, tmp_path: Path) -> None:
    res = tg("classify", str(tmp_path / "missing.log"))
    assert res.returncode == 2 and "cannot read the log" in res.stderr
    assert "Traceback" not in res.stderr
    log = tmp_path / "x.log"
    log.write_text("boom\n")
    res = tg("classify", str(log), "--exit-code", "eleven")
    assert res.returncode == 2 and "--exit-code: must be an integer" in res.stderr
    res = tg("classify", str(log), "--signal", "SIGNOPE")
    assert res.returncode == 2 and "unknown signal" in res.stderr


def test_explain_names_class_rule_line_fingerprint_and_budget(tg: TG) -> None:
    res = tg(
        "run",
        "--quiet",
        "--nproc",
        "2",
        "--",
        *child("1@0:print:OSError: [Errno 116] Stale file handle", "1@0:exit:1", "*:sleep:0.2"),
    )
    assert res.returncode == 0, res.stderr
    out = tg("explain", "child").stdout
    assert "worker-1 (root cause)" in out
    assert "class        retryable_message (retryable)" in out
    assert "rule         stale-nfs" in out
    assert "matched line OSError: [Errno 116] Stale file handle" in out
    assert "fingerprint  " in out
    assert "job_restarts 1/3 (2 left)" in out
    records = tg("records", "child").stdout
    header, _rule, row = records.splitlines()[:3]
    assert header.split() == ["#", "AT", "NODE", "REPLICA", "CODE", "SOURCE", "CLASS", "DECISION"]
    assert " log " in row and " retryable_message " in row
    agg = tg("records", "child", "--aggregate").stdout
    assert "1x  retryable_message" in agg and "worker-1" in agg
