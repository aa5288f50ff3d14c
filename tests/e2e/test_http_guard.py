"""A web page cannot drive the server: Host checks, JSON-only changes, no framing, a body cap.

Unit tests through Starlette's test client, then the same against a real server process.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from fastapi import FastAPI

try:
    from fastapi.testclient import TestClient
except (ImportError, RuntimeError):  # Starlette's test client needs httpx: the test extra
    pytest.skip("needs httpx (the test extra)", allow_module_level=True)
from test_server import server_factory  # noqa: F401  (the fixture)

from trainguard.service.http_guard import MAX_BODY, Guard, host_allowed


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/api/jobs")
    def jobs() -> list[str]:
        return []

    @app.post("/api/jobs/{ref}/cancel")
    def cancel(ref: str, body: dict[str, Any]) -> dict[str, str]:
        return {"id": ref}

    return app


@pytest.mark.parametrize(
    ("host", "bind", "ok"),
    [
        ("127.0.0.1:8470", "127.0.0.1", True),
        ("localhost:8470", "127.0.0.1", True),
        ("[::1]:8470", "127.0.0.1", True),
        ("127.0.0.2", "127.0.0.1", True),
        ("rebind.attacker.example:8470", "127.0.0.1", False),
        ("127.0.0.1.nip.io", "127.0.0.1", False),
        (None, "127.0.0.1", False),
        ("10.1.2.3:8470", "10.1.2.3", True),
        ("localhost:8470", "10.1.2.3", False),  # not a loopback bind: the address only
        ("trainguard.internal", "10.1.2.3", False),
        ("anything.example", "0.0.0.0", True),  # every interface: the token guards it
    ],
)
def test_host_allowed(host: str | None, bind: str, ok: bool) -> None:
    assert host_allowed(host, bind) is ok


def test_an_allowed_name_can_be_added() -> None:
    assert host_allowed("trainguard.internal:443", "10.1.2.3", ["trainguard.internal"])


@pytest.fixture
def client() -> TestClient:
    return TestClient(Guard(_app(), "127.0.0.1"), base_url="http://127.0.0.1:8470")


def test_a_rebinding_host_is_refused(client: TestClient) -> None:
    resp = client.get("/api/jobs", headers={"Host": "rebind.attacker.example"})
    assert resp.status_code == 400 and "invalid Host header" in resp.json()["detail"]
    assert client.get("/api/jobs").status_code == 200


@pytest.mark.parametrize(
    "kind", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data", None]
)
def test_a_simple_cross_site_post_is_refused(client: TestClient, kind: str | None) -> None:
    headers = {"Content-Type": kind} if kind else {}
    resp = client.post("/api/jobs/j1/cancel", content=b"{}", headers=headers)
    assert resp.status_code == 415, resp.text
    ok = client.post("/api/jobs/j1/cancel", json={})
    assert ok.status_code == 200 and ok.json() == {"id": "j1"}


def test_bodies_over_the_cap_are_refused(client: TestClient) -> None:
    big = b'{"x": "' + b"y" * MAX_BODY + b'"}'
    resp = client.post(
        "/api/jobs/j1/cancel", content=big, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 413

    def chunks() -> Any:  # no Content-Length: counted while read
        yield b'{"x": "'
        for _ in range(MAX_BODY // 65536 + 2):
            yield b"y" * 65536
        yield b'"}'

    resp = client.post(
        "/api/jobs/j1/cancel", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 413


def test_every_answer_forbids_framing(client: TestClient) -> None:
    for resp in (client.get("/api/jobs"), client.get("/api/jobs", headers={"Host": "evil"})):
        assert resp.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]
        assert resp.headers["x-content-type-options"] == "nosniff"


def _raw(url: str, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.mark.slow
def test_the_real_server_refuses_a_page_driving_it(server_factory: Any) -> None:  # noqa: F811
    srv = server_factory("--cpus", "2")
    spec = json.dumps({"spec": {"worker_pools": [{"command": ["true"]}]}}).encode()
    status, headers, _ = _raw(
        srv.url,
        "POST",
        "/api/jobs",
        spec,
        {"Host": "rebind.example", "Content-Type": "application/json"},
    )
    assert status == 400 and headers["x-frame-options"] == "DENY"
    status, _, _ = _raw(srv.url, "POST", "/api/jobs", spec, {"Content-Type": "text/plain"})
    assert status == 415
    assert srv.json("jobs") == []  # neither was stored
    status, headers, page = _raw(srv.url, "GET", "/", b"", {})
    assert status == 200 and b"<script" in page
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    job_id = srv.submit("--", "true")  # the CLI still works
    assert srv.wait_state(job_id, "SUCCEEDED", "FAILED") == "SUCCEEDED"


@pytest.mark.slow
def test_the_token_can_come_from_a_file(server_factory: Any, tmp_path: Any) -> None:  # noqa: F811
    secret = tmp_path / "token"
    secret.write_text("s3cret-from-a-file\n")
    srv = server_factory("--token-file", str(secret))
    res = srv.tg("jobs", "--server", srv.url, "--token-file", str(secret), "--json")
    assert res.returncode == 0, res.stderr
    res = srv.tg("jobs", "--server", srv.url, "--json")
    assert res.returncode != 0 and "token" in res.stderr
    empty = tmp_path / "empty"
    empty.write_text("")
    res = srv.tg("jobs", "--server", srv.url, "--token-file", str(empty))
    assert res.returncode == 2 and "the file is empty" in res.stderr
