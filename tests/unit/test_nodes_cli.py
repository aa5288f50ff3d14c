"""`trainguard nodes` and its API (R-EVID-4), in process: the table and --json, a release,
and every bad input as one line (exit 2 for the CLI, a 4xx for the API), nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

try:
    from fastapi.testclient import TestClient
except (ImportError, RuntimeError):  # Starlette's test client needs httpx: the test extra
    pytest.skip("needs httpx (the test extra)", allow_module_level=True)

from trainguard.cli.main import main
from trainguard.policy.probation import NodeEvent, NodeEventKind
from trainguard.records import nodes
from trainguard.records.store import Store
from trainguard.service.api import create_app
from trainguard.service.config import ServerConfig
from trainguard.service.scheduler import Service

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def seed(store: Store) -> None:
    """n1 on probation after three faults of two jobs; n2 with one fault, ok."""
    for i, job in enumerate(("job-a", "job-a", "job-b")):
        nodes.add(
            store,
            NodeEvent("n1", NodeEventKind.FAULT, 100.0 + i, job, i, "worker-1",
                      "retryable_message", "gpu-xid", XID, f"hardware fault (gpu-xid): {XID}",
                      "slurm"),
        )  # fmt: skip
    nodes.add(store, NodeEvent("n1", NodeEventKind.PROBATION, 103.0, "job-b", reason="3 from 2"))
    nodes.add(store, NodeEvent("n2", NodeEventKind.FAULT, 104.0, "job-c", reason="node lost: x"))


def run(home: Path, *argv: str) -> int:
    """The exit status, whether `main` returns it or argparse exits with it."""
    try:
        return main(["--home", str(home), *argv])
    except SystemExit as exc:
        return int(exc.code or 0)


def test_nodes_lists_the_ledger_as_a_table_and_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    assert run(home, "nodes") == 0
    assert capsys.readouterr().out == "no node has a machine-blamed failure yet\n"
    seed(Store(home))
    assert run(home, "nodes") == 0
    out = capsys.readouterr().out
    n1 = next(line for line in out.splitlines() if line.startswith("n1 "))
    assert "probation (needs check)" in n1 and "3 from 2" in n1
    assert "fault of job job-a attempt 0 worker-1: hardware fault (gpu-xid)" in out
    assert "probation: 3 from 2" in out
    assert run(home, "nodes", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["node"], r["state"], r["faults"], r["jobs"]) for r in rows] == [
        ("n1", "probation", 3, 2),
        ("n2", "ok", 1, 1),
    ]
    assert rows[0]["history"][0]["matched_line"] == XID


def test_release_forgives_a_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    seed(Store(home))
    assert run(home, "nodes", "release", "n1") == 0
    assert capsys.readouterr().out == "node n1 released: its faults so far no longer count\n"
    state = nodes.state_of(Store(home), "n1")
    assert not state.on_probation and state.faults == ()
    assert state.history[-1].reason is not None and state.history[-1].reason.startswith(
        "released by "
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["nodes", "release", "n9"], "trainguard: no node 'n9' in the node ledger (known: n1, n2)"),
        (["nodes", "release"], "trainguard: nodes release: name the node to release"),
        (
            ["nodes", "n1"],
            "trainguard nodes: error: argument action: invalid choice: 'n1' "
            "(choose from 'release')",
        ),
        (["nodes", "release", "n1", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_bad_node_commands_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    home = tmp_path / "home"
    seed(Store(home))
    before = nodes.nodes_view(Store(home))
    assert run(home, *argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert nodes.nodes_view(Store(home)) == before  # nothing stored


@pytest.fixture
def api(tmp_path: Path) -> TestClient:
    store = Store(tmp_path)
    seed(store)
    service = Service(store, ServerConfig(token="s3cret"), say=lambda _m: None)
    return TestClient(create_app(service), base_url="http://127.0.0.1:8470")


AUTH = {"Authorization": "Bearer s3cret"}


def test_the_api_lists_and_releases_nodes(api: TestClient) -> None:
    rows = api.get("/api/nodes", headers=AUTH).json()
    assert [(r["node"], r["state"]) for r in rows] == [("n1", "probation"), ("n2", "ok")]
    resp = api.post("/api/nodes/n1/release", json={}, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["state"] == "ok"
    assert resp.json()["history"][-1]["reason"] == "released by the server's API"


@pytest.mark.parametrize(
    ("path", "headers", "status", "says"),
    [
        ("/api/nodes/n1/release", {}, 401, "missing or wrong token"),
        ("/api/nodes/n9/release", AUTH, 404, "no node 'n9' in the node ledger"),
        ("/api/nodes/a%20b/release", AUTH, 422, "path.node: String should match pattern"),
        ("/api/nodes/" + "x" * 300 + "/release", AUTH, 422, "path.node: String should match"),
    ],
)
def test_a_bad_release_is_a_4xx_in_one_line_and_changes_nothing(
    api: TestClient, path: str, headers: dict[str, str], status: int, says: str
) -> None:
    resp = api.post(path, json={}, headers=headers)
    assert resp.status_code == status, resp.text
    detail = resp.json()["detail"]
    assert says in detail and "\n" not in detail
    assert api.get("/api/nodes", headers=AUTH).json()[0]["state"] == "probation"
    assert api.get("/api/nodes").status_code == 401  # reading needs the token too
