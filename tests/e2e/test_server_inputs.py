"""Bad server and connection inputs (issue 37): one line naming what is wrong, exit 2 for
the CLI and a 4xx for the API; never a traceback, a 500, or a silent yes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from fastapi.testclient import TestClient
except (ImportError, RuntimeError):  # Starlette's test client needs httpx: the test extra
    pytest.skip("needs httpx (the test extra)", allow_module_level=True)

from trainguard.cli.main import main
from trainguard.records.store import Store
from trainguard.service.api import create_app
from trainguard.service.config import ServerConfig
from trainguard.service.scheduler import Service


@pytest.fixture
def api(tmp_path: Path) -> TestClient:
    service = Service(Store(tmp_path), ServerConfig(require_token=False), say=lambda _m: None)
    return TestClient(create_app(service), base_url="http://127.0.0.1:8470")


@pytest.mark.parametrize("body", [b"1e999", b"-1e999", b"5", b"NaN", b"[1]", b'"spec"'])
def test_a_body_that_is_no_object_is_a_422_in_one_line(api: TestClient, body: bytes) -> None:
    resp = api.post("/api/jobs", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 422, resp.text
    detail = resp.json()["detail"]
    assert detail.startswith("body: must be a JSON object") and "\n" not in detail
    assert api.get("/api/jobs").json() == []  # nothing stored


def test_other_validation_errors_do_not_echo_the_input(api: TestClient) -> None:
    resp = api.get("/api/jobs", params={"limit": "1e999"})
    assert resp.status_code == 422
    assert resp.json()["detail"].startswith("query.limit: ")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["jobs", "--server", "http://[::1"], "--server: not a valid URL (Invalid IPv6 URL)"),
        (["jobs", "--server", "http://host:99999"], "--server: not a valid URL (Port out of"),
        (["jobs", "--server", "ftp://host"], "--server: must be an http:// or https:// URL"),
        (["jobs", "--token-file", "/nonexistent"], "--token-file /nonexistent: cannot read it"),
        (["status", "x", "--token-file", "/nonexistent"], "--token-file /nonexistent: cannot"),
    ],
)
def test_bad_connection_flags_are_one_line_and_exit_2(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    assert main(["--home", str(home), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainguard: {says}") and err.count("\n") == 1, err
    assert not home.exists()  # nothing stored


@pytest.mark.slow
def test_a_server_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home = tmp_path / "home"
        argv = [sys.executable, "-m", "trainguard", "--home", str(home), "server"]
        res = subprocess.run(
            [*argv, "--port", str(port)], capture_output=True, text=True, timeout=60
        )
    assert res.returncode == 2, res
    assert res.stderr == (
        f"trainguard: --port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"
        " (--port 0 picks a free one)\n"
    )
    assert not home.exists()  # nothing stored
