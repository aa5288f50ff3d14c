"""The command sink (real child processes) and the apprise sink (real apprise)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from notify_harness import (  # noqa: F401  (fixtures)
    FAST,
    Receiver,
    _no_proxy,
    notifier,
    receiver,
    timed,
    wait_until,
)

from trainguard.notify.notifier import Notifier
from trainguard.spec.notify_rules import NotifyRule

RECORD = r"""
import json, os, sys
names = ["TRAINGUARD_EVENT", "TRAINGUARD_JOB_ID", "TRAINGUARD_JOB_NAME", "TRAINGUARD_EVENT_TEXT"]
seen = {"stdin": sys.stdin.read(), "env": {k: os.environ.get(k) for k in names}}
with open(sys.argv[1], "a") as f:
    f.write(json.dumps(seen) + "\n")
print("boom", file=sys.stderr)
sys.exit(int(sys.argv[2]))
"""


@pytest.mark.slow
def test_command_sink_gets_json_on_stdin_and_env(
    tmp_path: Path, notifier: Callable[..., Notifier]
) -> None:
    out = tmp_path / "seen.jsonl"
    rule = NotifyRule(sink="command", command=[sys.executable, "-c", RECORD, str(out), "0"])
    n = notifier([rule])
    n.emit("hang", "worker-1 stuck in allreduce", replica="worker-1")
    n.close(timeout_s=10)
    (seen,) = [json.loads(line) for line in out.read_text().splitlines()]
    event = json.loads(seen["stdin"])
    assert event["event"] == "hang" and event["replica"] == "worker-1"
    assert seen["env"] == {
        "TRAINGUARD_EVENT": "hang",
        "TRAINGUARD_JOB_ID": "j-1",
        "TRAINGUARD_JOB_NAME": "llama",
        "TRAINGUARD_EVENT_TEXT": "worker-1 stuck in allreduce",
    }
    assert n.stats["delivered"] == 1


@pytest.mark.slow
def test_command_sink_nonzero_exit_is_retried_then_failed(
    tmp_path: Path, notifier: Callable[..., Notifier], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.notify")
    out = tmp_path / "seen.jsonl"
    rule = NotifyRule(
        sink="command", command=[sys.executable, "-c", RECORD, str(out), "3"], retries=2, **FAST
    )
    n = notifier([rule])
    n.emit("restart", "restart 2")
    wait_until(lambda: n.stats["failed"] == 1)
    assert len(out.read_text().splitlines()) == 3
    assert any("exit code 3: boom" in rec.getMessage() for rec in caplog.records)


@pytest.mark.slow
def test_command_sink_missing_program_fails_without_retry(
    tmp_path: Path, notifier: Callable[..., Notifier]
) -> None:
    n = notifier([NotifyRule(sink="command", command=[str(tmp_path / "nope")], retries=3)])
    n.emit("restart", "restart 2")
    took = timed(lambda: wait_until(lambda: n.stats["failed"] == 1))
    assert took < 1  # no backoff waits: a missing program does not appear by retrying


# ---------------------------------------------------------------- apprise


def test_apprise_json_url_posts_to_a_local_receiver(
    receiver: Callable[..., Receiver], notifier: Callable[..., Notifier]
) -> None:
    pytest.importorskip("apprise")
    r = receiver()
    host = r.url.removeprefix("http://")
    n = notifier([NotifyRule(sink="apprise", url=f"json://{host}/apprise", **FAST)])
    n.emit("state_change", "llama failed: exit 1", state="FAILED", previous="RUNNING")
    wait_until(lambda: n.stats["delivered"] == 1)
    (hit,) = r.hits
    assert hit.path == "/apprise"
    assert hit.json["title"] == "trainguard: llama state_change"
    assert hit.json["message"] == "llama failed: exit 1"
    assert hit.json["type"] == "failure"


def test_apprise_missing_is_one_warning_and_no_crash(
    notifier: Callable[..., Notifier],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainguard.notify")
    monkeypatch.setitem(sys.modules, "apprise", None)  # makes `import apprise` fail
    n = notifier([NotifyRule(sink="apprise", url="json://127.0.0.1:9/x", **FAST)])
    for i in range(3):
        n.emit("custom_message", f"m{i}")
    wait_until(lambda: n.stats["failed"] == 3)
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "trainguard.notify"]
    assert len(lines) == 1 and "apprise is not installed" in lines[0]
