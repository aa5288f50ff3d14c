"""Hostile job data through the real CLI against a real state home (issue 37): markup
and escape sequences a replica prints or raises, in its environment and its command,
are shown by every command that reads the job, never parsed nor obeyed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TG

pytestmark = pytest.mark.slow

HOSTILE = "[/] [bold red]x [link=http://x]y[/link] \x1b]0;title\x07 \x1b[2J"
RAW = ("\x1b]", "\x07", "\x1b[2J")
REPLICA = f"""\
import sys
print("step 1 loss 0.5 " + {HOSTILE!r}, flush=True)
raise RuntimeError("boom " + {HOSTILE!r})
"""


def _clean(res: subprocess.CompletedProcess[str], what: str) -> str:
    """A command's output: it ran, said no traceback, and wrote no raw sequence."""
    out, err = res.stdout, res.stderr
    assert res.returncode == 0, f"{what}: {err[-2000:]}"
    assert "Traceback" not in err and "MarkupError" not in err, f"{what}: {err[-2000:]}"
    for stream in (out, err):
        assert not [raw for raw in RAW if raw in stream], f"{what}: {stream!r}"
    return out


def test_hostile_job_data_is_shown_by_every_command(tg: TG, tmp_path: Path) -> None:
    script = tmp_path / "hostile.py"
    script.write_text(REPLICA)
    res = tg(
        "run",
        "--quiet",
        "--retryable-error",
        "boom",
        "--max-restarts",
        "1",
        "--env",
        f"HOSTILE={HOSTILE}",
        "--",
        sys.executable,
        str(script),
        HOSTILE,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    for stream in (res.stdout, res.stderr):  # the run's lines and its final report
        assert not [raw for raw in RAW if raw in stream], repr(stream)
    assert "Termination reason: RuntimeError: boom [/] [bold red]x" in res.stderr
    assert "\\x1b]0;title\\x07 \\x1b[2J" in res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("FAILED", 2)  # a restart: records has a row
    assert HOSTILE in job["error_message"]  # stored as it was: escaped only when shown
    jid = job["id"]

    status = _clean(tg("status", jid), "status")
    assert "[link=http://x]y[/link]" in status and "\\x1b[2J" in status
    _clean(tg("status", jid, "--json"), "status --json")
    assert jid in _clean(tg("jobs"), "jobs")
    records = _clean(tg("records", jid), "records")
    assert "[bold red]x [link=http://x]y[/link]" in records
    aggregate = _clean(tg("records", jid, "--aggregate"), "records --aggregate")
    assert "RuntimeError: boom [/] [bold red]x" in aggregate
    explain = _clean(tg("explain", jid), "explain")
    assert "matched line RuntimeError: boom [/] [bold red]x [link=http://x]y[/link]" in explain
    assert json.loads(_clean(tg("explain", jid, "--json"), "explain --json"))["failures"]
    _clean(tg("goodput", jid), "goodput")
    _clean(tg("stacks", jid), "stacks")
    log = next(Path(job["log_dir"]).rglob("*.log"))
    classified = _clean(tg("classify", str(log), "--exit-code", "1"), "classify")
    assert "RuntimeError: boom [/]" in classified
