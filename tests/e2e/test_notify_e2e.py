"""Notifications from real masters: a job's own rules, and a server's rules for every job."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TG, child, wait_for
from notify_harness import (  # noqa: F401  (fixtures)
    Receiver,
    _no_proxy,
    dead_url,
    receiver,
)
from test_server import Server

from trainguard.notify.signing import verify

pytestmark = pytest.mark.slow  # a real server and jobs


@pytest.fixture
def hook(receiver: Callable[..., Receiver]) -> Receiver:
    """One real HTTP receiver (tests/support/notify_harness.py) for the job's webhooks."""
    return receiver()


def _events(r: Receiver) -> list[dict[str, Any]]:
    return [h.json for h in r.hits]


def test_a_job_spec_rule_runs_a_command_and_posts_a_webhook(
    tg: TG, tmp_path: Path, hook: Receiver
) -> None:
    out = tmp_path / "events.jsonl"
    spec = {
        "name": "noisy",
        "worker_pools": [
            {
                "replicas": 2,
                "command": child(
                    "1@0:message:loss is NaN", "1@0:signal:SIGKILL", "0:sleep:1", "*:print:ok"
                ),
            }
        ],
        "notifications": [
            {
                "sink": "command",
                "events": ["restart", "custom_message"],
                "command": [
                    sys.executable,
                    "-c",
                    f"import sys; open({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')",
                ],
            },
            {
                "sink": "webhook",
                "url": f"{hook.url}/hook",
                "secret": "k",
                "events": ["state_change"],
                "states": ["SUCCEEDED"],
            },
            {"sink": "webhook", "url": dead_url(), "retries": 1},  # down: must not matter
        ],
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    res = tg("run", "--quiet", "-f", str(path))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    kinds = [e["event"] for e in lines]
    assert kinds.count("custom_message") == 1 and kinds.count("restart") == 1
    assert next(e for e in lines if e["event"] == "custom_message")["text"] == "loss is NaN"
    posted = _events(hook)
    assert [(e["event"], e["state"]) for e in posted] == [("state_change", "SUCCEEDED")]
    first = hook.hits[0]
    assert verify("k", first.body, first.headers["x-trainguard-signature"])


def test_server_rules_reach_every_job(tg: TG, tmp_path: Path, hook: Receiver) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "quota": {"cpus": 2},
                "notifications": [
                    {
                        "sink": "webhook",
                        "url": f"{hook.url}/hook",
                        "events": ["restart", "state_change"],
                    }
                ],
            }
        )
    )
    srv = Server(tg, "--config", str(config)).start()
    try:
        job_id = srv.submit(
            "--nproc-per-node", "2", "--", *child("1@0:signal:SIGKILL", "0:sleep:1", "*:print:x")
        )
        assert srv.wait_state(job_id, "SUCCEEDED", "FAILED") == "SUCCEEDED"
        events = wait_for(
            lambda: (e := _events(hook)) and e[-1].get("state") == "SUCCEEDED" and e,
            15,
            "the SUCCEEDED notification",
        )
        assert {e["job_id"] for e in events} == {job_id}
        assert [e["event"] for e in events].count("restart") == 1
        states = [e["state"] for e in events if e["event"] == "state_change"]
        assert states[0] == "RUNNING" and "RESTARTING" in states and states[-1] == "SUCCEEDED"
    finally:
        srv.stop()
