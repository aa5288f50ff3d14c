"""Notifications from real masters: a job's own rules, and a server's rules for every job."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TG, child, wait_for
from test_server import Server

from trainguard.notify.signing import verify


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((dict(self.headers), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.httpd.shutdown()


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/down"


def test_a_job_spec_rule_runs_a_command_and_posts_a_webhook(
    tg: TG, tmp_path: Path, receiver: Receiver
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
                "url": receiver.url,
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
    posted = receiver.events()
    assert [(e["event"], e["state"]) for e in posted] == [("state_change", "SUCCEEDED")]
    headers, body = receiver.got[0]
    assert verify("k", body, headers["X-Trainguard-Signature"])


def test_server_rules_reach_every_job(tg: TG, tmp_path: Path, receiver: Receiver) -> None:
    config = tmp_path / "server.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "quota": {"cpus": 2},
                "notifications": [
                    {"sink": "webhook", "url": receiver.url, "events": ["restart", "state_change"]}
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
            lambda: (e := receiver.events()) and e[-1].get("state") == "SUCCEEDED" and e,
            15,
            "the SUCCEEDED notification",
        )
        assert {e["job_id"] for e in events} == {job_id}
        assert [e["event"] for e in events].count("restart") == 1
        states = [e["state"] for e in events if e["event"] == "state_change"]
        assert states[0] == "RUNNING" and "RESTARTING" in states and states[-1] == "SUCCEEDED"
    finally:
        srv.stop()
