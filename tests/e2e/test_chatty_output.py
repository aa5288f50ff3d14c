"""A chatty replica is not held back by progress reading (issue 37): with progress read
from its output (the default) it gets out at least half of what it gets out with
`--no-progress`, measured side by side (it got a twelfth before the fix)."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, TG

pytestmark = pytest.mark.slow

CHATTY = str(ROOT / "tests" / "bins" / "chatty_output.py")


def _bytes_out(tg: TG, name: str, *flags: str) -> int:
    out = tg.home.parent / f"{name}.json"
    res = tg(
        "run",
        "--quiet",
        "--job-name",
        name,
        *flags,
        "--",
        sys.executable,
        CHATTY,
        "4",  # seconds
        "50e6",  # bytes a second, in 1 KiB "step N loss L xxx..." lines
        str(out),
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return int(json.loads(out.read_text())["bytes"])


def test_progress_reading_does_not_hold_a_chatty_replica_back(tg: TG) -> None:
    without = _bytes_out(tg, "quiet-master", "--no-progress")
    with_progress = _bytes_out(tg, "reading-master")
    assert with_progress >= without / 2, (with_progress, without)
    progress = tg.json("status", "reading-master")["progress"]
    assert progress["metrics"]["progress_from"] == "keyword"  # it was still read
    assert progress["step"] > 1000
