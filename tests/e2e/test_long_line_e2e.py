"""A real replica's traceback glued to the end of a 1 MB line (issue 37): the cut of
over-long lines drops the header, and the root error must still be read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TG

pytestmark = pytest.mark.slow

REPLICA = """\
import sys
sys.stdout.write("x" * 1_000_000)  # no newline: the traceback's header follows on its line
sys.stdout.flush()
raise RuntimeError("boom after a long line")
"""


def test_a_traceback_after_a_1mb_line_names_its_error(tg: TG, tmp_path: Path) -> None:
    script = tmp_path / "long_line.py"
    script.write_text(REPLICA)
    res = tg("run", "--quiet", "--max-restarts", "0", "--", sys.executable, str(script))
    assert res.returncode == 1, res.stderr[-2000:]
    job = tg.only_job()
    assert job["state"] == "FAILED"
    assert job["error_message"] == (
        "The replica worker-0 exited with a non-zero status of 1. "
        "Termination reason: RuntimeError: boom after a long line. "
        "(proof: rule python-traceback, an uncaught exception in the job's code)"
    )
    (failure,) = json.loads(tg("explain", job["id"], "--json").stdout)["failures"]
    assert (failure["rule"], failure["matched_line"]) == (
        "python-traceback",
        "RuntimeError: boom after a long line",
    )
