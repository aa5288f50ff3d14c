"""Job data is text, never markup nor terminal control (issue 37): what a job printed or
raised reaches rich and the terminal seen, never obeyed. Fast: no process is started."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.classify.logtail import printable
from trainguard.cli.live import LiveRun
from trainguard.cli.readers import status_text
from trainguard.cli.render import jobs_table, live_panel, records_renderable, to_text
from trainguard.hangs.stack_model import Frame, ReplicaStacks, ThreadStack
from trainguard.hangs.stacks import aggregate, render
from trainguard.records.explain import print_aggregate, print_explain

HOSTILE = "[/] [bold red]x [link=http://x]y[/link] \x1b]0;title\x07 \x1b[2J"
SHOWN = "[/] [bold red]x [link=http://x]y[/link] \\x1b]0;title\\x07 \\x1b[2J"
RAW = ("\x1b]", "\x07", "\x1b[2J")


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal wide enough that rich wraps none of the lines checked (with colour)."""
    monkeypatch.setenv("COLUMNS", "200")


def clean(text: str) -> str:
    """`text` must hold none of the raw sequences; returned for further checks."""
    assert not [raw for raw in RAW if raw in text], repr(text)
    return text


def test_printable_escapes_what_a_terminal_obeys_and_keeps_lines() -> None:
    assert printable(HOSTILE) == SHOWN
    assert printable("a\tb\nc \x9b2J \u202eevil é") == "a\tb\nc \\x9b2J \\u202eevil é"


def _view() -> dict[str, Any]:
    return {
        "id": "tg-1",
        "name": "demo",
        "state": "FAILED",
        "attempts": 1,
        "restarts": 0,
        "created_at_s": 1000.0,
        "ended_at_s": 1010.0,
        "error_message": f"The replica worker-0 failed. Termination reason: {HOSTILE}.",
        "error_code": 1,
        "queued_reason": HOSTILE,
        "log_dir": f"/tmp/{HOSTILE}",
        "progress": {"step": 3, "at_s": 1005.0, "metrics": {f"loss{HOSTILE}": 0.5}},
        "replicas": [
            {
                "name": "worker-0",
                "rank": 0,
                "state": "FAILED",
                "pid": 7,
                "exit_code": 1,
                "signal": None,
                "node": HOSTILE,
            }
        ],
    }


@pytest.mark.parametrize("color", [False, True])
def test_status_shows_markup_and_escapes_as_text(color: bool) -> None:
    text = clean(status_text(_view(), color))
    assert "Termination reason: [/] [bold red]x [link=http://x]y[/link]" in text
    assert "\\x1b]0;title\\x07" in text


def test_jobs_records_and_the_panel_show_job_data_as_text() -> None:
    row = {"id": "tg-1", "name": "demo", "state": "FAILED", "attempts": 1, "last_step": 3}
    jobs = to_text(jobs_table([{**row, "created_at_s": 1.0, "queued_reason": HOSTILE}]))
    assert "[bold red]x" in clean(jobs)
    record: dict[str, Any] = {
        "round": 1,
        "at_s": 1.0,
        "node": HOSTILE,
        "replica": "worker-0",
        "error_code": 1,
        "error_source": "log",
        "failure_class": "user_error",
        "decision": HOSTILE,
        "error_message": HOSTILE,
        "cascade": HOSTILE,
        "isolated": None,
        "snapshot_id": None,
        "job_id": "tg-1",
        **dict.fromkeys(("detect_ms", "stop_ms", "schedule_ms", "start_ms", "first_output_ms")),
    }
    assert "#1 " + SHOWN in clean(to_text(records_renderable([record])))
    for color in (False, True):
        panel = to_text(live_panel(_view(), (HOSTILE, 1000.0), None, 1010.0), color)
        assert "[link=http://x]y[/link]" in clean(panel)


class _Reader:
    def status(self, ref: str) -> dict[str, Any]:
        return _view()


def test_the_live_panel_prints_trainguard_lines_as_text(tmp_path: Path) -> None:
    with open(tmp_path / "out", "w") as out:
        live = LiveRun(_Reader(), out)  # type: ignore[arg-type]
        live.job_id = "tg-1"
        live.say(f"worker-0 failed: {HOSTILE}")
        live._render()
    assert f"trainguard: worker-0 failed: {SHOWN}" in clean((tmp_path / "out").read_text())


def test_explain_and_aggregate_escape_what_the_replica_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    failure = {
        "attempt": 0,
        "replica": "worker-0",
        "root_cause": True,
        "cascade_of": None,
        "failure_class": "user_error",
        "retryable": False,
        "rule": "python-traceback",
        "matched_line": HOSTILE,
        "confidence": 0.85,
        "phase": "training",
        "step": 1,
        "notes": HOSTILE,
        "fingerprint": "f",
        "message": HOSTILE,
        "decision": HOSTILE,
    }
    job = {"id": "tg-1", "name": "demo", "state": "FAILED", "attempts": 1}
    print_explain({**job, "error_code": 1, "error_message": HOSTILE}, [failure])
    assert f"matched line {SHOWN}" in clean(capsys.readouterr().out)
    group = {"count": 1, "failure_class": "user_error", "rule": "r", "fingerprint": "f"}
    print_aggregate([{**group, "replicas": ["worker-0"], "example": HOSTILE}])
    assert f"       {SHOWN}" in clean(capsys.readouterr().out)


def test_stacks_escape_the_names_a_process_gave() -> None:
    frame = Frame(f"step{HOSTILE}", f"/app/{HOSTILE}.py", 3, False)
    threads = (ThreadStack(1, "MainThread", True, (frame,)),)
    snaps = [ReplicaStacks("worker-0", 0, 1000, "py-spy", True, None, 1.0, threads)]
    assert f"step{SHOWN}" in clean(render(aggregate(snaps)))
