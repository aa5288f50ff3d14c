"""`trainguard status -w` (the status again while it changes, until the job ends) and
`trainguard completion` (a shell completion script made from the parser)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from trainguard.cli import completion
from trainguard.cli.parser import build_parser
from trainguard.cli.readers import watch_status


def _view(state: str, replica: str = "RUNNING") -> dict[str, Any]:
    return {
        "id": "job-1",
        "name": "t",
        "state": state,
        "attempts": 1,
        "restarts": 0,
        "created_at_s": 1.0,
        "ended_at_s": None,
        "error_message": None,
        "error_code": None,
        "log_dir": "/tmp/x",
        "replicas": [
            {
                "name": "worker-0",
                "rank": 0,
                "state": replica,
                "pid": 7,
                "exit_code": None,
                "signal": None,
            }
        ],
    }


class _Reader:
    def __init__(self, views: list[dict[str, Any]]) -> None:
        self.views = views
        self.calls = 0

    def status(self, ref: str) -> dict[str, Any]:
        self.calls += 1
        return self.views[min(self.calls, len(self.views)) - 1]


def test_watch_prints_each_change_once_and_stops_when_the_job_ends(
    capsys: pytest.CaptureFixture[str],
) -> None:
    running = _view("RUNNING")
    reader = _Reader([running, running, running, _view("SUCCEEDED", "SUCCEEDED")])
    naps: list[float] = []
    assert watch_status("job-1", reader, 0.5, False, sleep=naps.append) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out.count("state     RUNNING") == 1 and out.count("state     SUCCEEDED") == 1
    assert "\x1b[" not in out  # not a terminal: no screen control
    assert reader.calls == 4 and naps == [0.5, 0.5, 0.5]


def test_watch_as_json_is_one_object_per_line_per_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reader = _Reader([_view("PENDING"), _view("RUNNING"), _view("FAILED", "FAILED")])
    watch_status("job-1", reader, 1, True, sleep=lambda _s: None)  # type: ignore[arg-type]
    states = [json.loads(line)["state"] for line in capsys.readouterr().out.splitlines()]
    assert states == ["PENDING", "RUNNING", "FAILED"]


def test_ctrl_c_ends_the_watch_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(_s: float) -> None:
        raise KeyboardInterrupt

    reader = _Reader([_view("RUNNING")])
    assert watch_status("job-1", reader, 1, False, sleep=interrupted) == 0  # type: ignore[arg-type]
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "expected"), [(["-w"], 2.0), (["-w", "0.5"], 0.5), ([], None)])
def test_the_watch_flag(argv: list[str], expected: float | None) -> None:
    args = build_parser().parse_args(["status", "job-1", *argv])
    assert args.watch == expected


def test_a_watch_interval_that_makes_no_sense_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["status", "job-1", "-w", "0"])
    assert "must be from 0.1 to 86400 seconds" in capsys.readouterr().err


def _complete(tmp_path: Any, *words: str) -> list[str]:
    """What bash completes for `trainguard WORDS...` (the last word being typed)."""
    script = tmp_path / "tg.bash"
    script.write_text(completion.script(build_parser(), "bash"))
    line = " ".join(f"'{w}'" for w in ("trainguard", *words))
    res = subprocess.run(
        [
            "bash",
            "-c",
            f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
            '_trainguard; printf "%s\\n" "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    return sorted(w for w in res.stdout.splitlines() if w)


@pytest.mark.slow
def test_bash_completes_commands_and_each_commands_flags(tmp_path: Any) -> None:
    assert _complete(tmp_path, "st") == ["stacks", "status"]
    assert "_master" not in _complete(tmp_path, "")  # internal: never offered
    assert _complete(tmp_path, "status", "job-1", "--w") == ["--watch"]
    assert "--nproc-per-group" in _complete(tmp_path, "run", "--nproc")


def test_the_zsh_script_is_the_bash_one_through_bashcompinit() -> None:
    text = completion.script(build_parser(), "zsh")
    assert text.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert "complete -F _trainguard trainguard" in text
