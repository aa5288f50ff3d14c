"""The node ledger on the web page and through a real server (R-EVID-4): Debian's Chromium
via Playwright shows a node on probation with its history and releases it; the CLI asks
the same server (`nodes --server`) and gets one line for an unknown node."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_web import CHROMIUM, Server

from trainguard.policy.probation import NodeEvent, NodeEventKind
from trainguard.records import nodes
from trainguard.records.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.browser]

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def _seed(home: Path) -> None:
    store = Store(home)
    for i, job in enumerate(("job-a", "job-a", "job-b")):
        nodes.add(
            store,
            NodeEvent("gpu-7", NodeEventKind.FAULT, 1.7e9 + i, job, i, "worker-1",
                      "retryable_message", "gpu-xid", XID, "hardware fault (gpu-xid)", "slurm"),
        )  # fmt: skip
    nodes.add(store, NodeEvent("gpu-7", NodeEventKind.PROBATION, 1.7e9 + 3, reason="3 from 2"))
    nodes.add(store, NodeEvent("gpu-8", NodeEventKind.FAULT, 1.7e9 + 4, "job-c", reason="lost"))
    store.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "home")
    yield s
    s.stop()


@pytest.fixture
def page() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        pg = b.new_page(viewport={"width": 1280, "height": 900})
        pg.set_default_timeout(10_000)
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        yield pg
        b.close()
        assert errors == []  # no uncaught exception in the page's script


def test_the_page_shows_a_node_on_probation_and_releases_it(server: Server, page: Any) -> None:
    from playwright.sync_api import expect

    _seed(server.home)
    page.goto(f"{server.url}/#token={server.token}")
    page.get_by_test_id("nav-nodes").click()
    rows = page.get_by_test_id("node-row")
    expect(rows).to_have_count(2)
    bad = page.locator('[data-testid="node-row"][data-node="gpu-7"]')
    expect(bad.get_by_test_id("node-state")).to_contain_text("probation")
    expect(bad.get_by_test_id("node-state")).to_contain_text("needs check")
    expect(bad).to_contain_text("3 from 2")
    bad.locator("summary").click()
    expect(bad.get_by_test_id("node-event")).to_have_count(4)
    expect(bad.get_by_test_id("node-event").first).to_contain_text(XID)
    ok = page.locator('[data-testid="node-row"][data-node="gpu-8"]')
    expect(ok.get_by_test_id("node-release")).to_have_count(0)

    bad.get_by_test_id("node-release").click()
    expect(page.get_by_test_id("notice")).to_contain_text("node gpu-7 released")
    expect(bad.get_by_test_id("node-state")).to_have_text("ok")
    assert not nodes.state_of(Store(server.home), "gpu-7").on_probation


def test_the_cli_asks_a_server_for_its_nodes(server: Server) -> None:
    _seed(server.home)
    assert server.token is not None
    flags = ("--server", server.url, "--token", server.token)
    res = server.tg("--home", str(server.home), "nodes", "--json", *flags)
    assert res.returncode == 0, res.stderr
    assert [(r["node"], r["state"]) for r in json.loads(res.stdout)] == [
        ("gpu-7", "probation"),
        ("gpu-8", "ok"),
    ]
    res = server.tg("--home", str(server.home), "nodes", "release", "gpu-9", *flags)
    assert res.returncode == 2
    assert res.stderr == ("trainguard: no node 'gpu-9' in the node ledger (known: gpu-7, gpu-8)\n")
    res = server.tg("--home", str(server.home), "nodes", "release", "gpu-7", *flags)
    assert res.returncode == 0 and "node gpu-7 released" in res.stdout
    assert not nodes.state_of(Store(server.home), "gpu-7").on_probation
