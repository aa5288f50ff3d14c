"""The CLI's tables and the live panel of `trainguard run` (issue 20): rich on a terminal,
plain text in a pipe; the panel under a real pseudo-terminal, and --plain without it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli.live import READ_EVERY_S, LiveRun
from trainguard.cli.readers import status_text
from trainguard.cli.render import jobs_table, live_panel, progress_line, to_text


def _view(state: str = "RUNNING", step: int | None = 120, **progress: Any) -> dict[str, Any]:
    return {
        "id": "tg-1",
        "name": "demo",
        "state": state,
        "attempts": 2,
        "restarts": 1,
        "created_at_s": 1000.0,
        "ended_at_s": None,
        "error_message": None,
        "error_code": None,
        "log_dir": "/tmp/x",
        "progress": {
            "step": step,
            "at_s": 1010.0,
            "metrics": {"loss": 0.3125, "progress_from": "keyword", **progress},
        },
        "replicas": [
            {
                "name": "worker-0",
                "rank": 0,
                "state": "RUNNING",
                "pid": 7,
                "exit_code": None,
                "signal": None,
                "node": None,
            },
            {
                "name": "worker-1",
                "rank": 1,
                "state": "FAILED",
                "pid": 8,
                "exit_code": -9,
                "signal": "SIGKILL",
                "node": None,
            },
        ],
    }


def test_jobs_in_a_pipe_are_one_plain_row_each() -> None:
    rows = [
        {
            "id": "tg-20261202-abcdef",
            "name": "a-long-job-name-indeed",
            "state": "RUNNING",
            "attempts": 1,
            "last_step": 5,
            "created_at_s": 1.0,
            "queued_reason": None,
        },
    ]
    text = to_text(jobs_table(rows))
    assert "\x1b[" not in text
    header, _rule, row = text.splitlines()
    assert header.split() == ["ID", "NAME", "STATE", "ATTEMPTS", "STEP", "CREATED", "NOTE"]
    assert row.split()[:5] == ["tg-20261202-abcdef", "a-long-job-name-indeed", "RUNNING", "1", "5"]


def test_status_shows_progress_and_each_replica() -> None:
    text = status_text(_view())
    assert "state     RUNNING" in text
    assert "progress  step 120  loss 0.3125  (read from the output: keyword)" in text
    row = next(line for line in text.splitlines() if line.startswith("worker-1"))
    assert row.split() == ["worker-1", "1", "FAILED", "8", "-9", "(SIGKILL)"]


def test_progress_in_epochs_when_that_is_what_the_output_counts() -> None:
    line = progress_line({"step": 2500, "metrics": {"progress_from": "hf-trainer-epoch"}})
    assert line is not None and line.startswith("epoch 2.5")
    assert progress_line({"step": None}) is None


def test_the_panel_says_state_attempt_replicas_step_rate_restarts_elapsed_activity() -> None:
    text = to_text(
        live_panel(_view(), ("hang detected after 30.0 s: taking stacks", 1030.0), 8.0, 1065.0)
    )
    assert (
        "demo RUNNING  attempt 1  replicas 1/2 running, 1 failed  restarts 1  elapsed 1:05" in text
    )
    assert "step 120 (8/s)  loss 0.3125" in text
    assert "hang detected after 30.0 s: taking stacks  (0:35)" in text  # a wait shows its time
    assert "starting" in to_text(live_panel(None, None, None, 0.0))


class _Reader:
    def __init__(self) -> None:
        self.calls = 0
        self.step = 0

    def status(self, ref: str) -> dict[str, Any]:
        self.calls += 1
        self.step += 10
        view = _view(step=self.step)
        view["progress"]["at_s"] = float(self.calls)
        return view


def test_the_panel_reads_the_store_at_most_twice_a_second_and_measures_the_rate(
    tmp_path: Path,
) -> None:
    now = [100.0]
    reader = _Reader()
    with open(tmp_path / "out", "w") as out:
        live = LiveRun(reader, out, clock=lambda: now[0])  # type: ignore[arg-type]
        live.job_id = "tg-1"
        for _ in range(20):
            live._render()  # every print re-renders: the reads stay rate-limited
        assert reader.calls == 1
        for _ in range(3):
            now[0] += READ_EVERY_S
            live._render()
        assert reader.calls == 4
        assert live._rate() == 10.0  # 10 steps per second of progress time
        live.say("job tg-1 RESTARTING: RestartJob: ...")
    assert live._activity == ("job tg-1 RESTARTING: RestartJob: ...", now[0])


TRAIN = (
    "import time\n"
    "for i in range(1, 30):\n"
    "    print(f'step {i} loss 0.5', flush=True)\n"
    "    time.sleep(0.05)\n"
)


def _run_in_a_terminal(tmp_path: Path, *extra: str, script: str = TRAIN, rc: int = 0) -> str:
    """`trainguard run` with a pseudo-terminal as its stdout; everything it drew."""
    (tmp_path / "train.py").write_text(script)
    env = {**os.environ, "TRAINGUARD_HOME": str(tmp_path / "home"), "COLUMNS": "100"}
    main, child = pty.openpty()
    cmd = [sys.executable, "-m", "trainguard", "run", *extra, "--", sys.executable, "train.py"]
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, cwd=tmp_path, env=env)
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the child side closed
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    proc.wait(timeout=30)
    os.close(main)
    assert proc.returncode == rc, b"".join(chunks).decode(errors="replace")[-2000:]
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_run_on_a_terminal_keeps_a_panel_below_the_output(tmp_path: Path) -> None:
    drawn = _run_in_a_terminal(tmp_path)
    assert "╭" in drawn and "trainguard tg-" in drawn  # the panel's frame and title
    assert "[worker-0]: step 29 loss 0.5" in drawn  # the replica's lines above it
    assert "SUCCEEDED" in drawn and "step 29" in drawn


@pytest.mark.slow
def test_plain_draws_no_panel(tmp_path: Path) -> None:
    drawn = _run_in_a_terminal(tmp_path, "--plain")
    assert "╭" not in drawn and "[worker-0]: step 29 loss 0.5" in drawn
    assert "trainguard: job tg-" in drawn


@pytest.mark.slow
def test_run_on_a_terminal_shows_hostile_job_data_as_text(tmp_path: Path) -> None:
    """The panel, trainguard's lines and the final report: markup from the job is shown
    (no MarkupError), its escape sequences written out, never sent to the terminal."""
    hostile = "[/] [bold red]x [link=http://x]y[/link] \x1b]0;title\x07 \x1b[2J"
    script = f"print('step 1 loss 0.5', flush=True)\nraise RuntimeError({hostile!r})\n"
    drawn = _run_in_a_terminal(tmp_path, "--quiet", "--max-restarts", "0", script=script, rc=1)
    assert "╭" in drawn and "MarkupError" not in drawn
    assert "\x1b]" not in drawn and "\x07" not in drawn and "\x1b[2J" not in drawn
    assert "RuntimeError: [/] [bold red]x [link=http://x]y[/link] \\x1b]0;title\\x07" in drawn
