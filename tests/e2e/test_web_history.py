"""The job page's history pages through the events (issue 37): after its first answer it
asks only for events newer than the last it holds, so a job with many custom messages
does not make every one-second poll a download of all of them."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from test_web import Server, browser, page, servers  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TALKER = """\
import sys, time
from pathlib import Path
from trainguard import sdk
for i in range(int(sys.argv[1])):
    sdk.send_custom_message(f"message {i}")
while not Path(sys.argv[2]).exists():
    sdk.send_custom_message(f"still here {time.monotonic():.1f}")
    time.sleep(0.5)
"""


def test_the_history_asks_only_for_new_events(
    servers: list[Server],  # noqa: F811 (the fixture)
    page: Any,  # noqa: F811 (the fixture)
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    server = Server(tmp_path / "home")
    servers.append(server)
    script, gate = tmp_path / "talk.py", tmp_path / "gate"
    script.write_text(TALKER)
    job_id = server.submit("--", sys.executable, str(script), "60", str(gate))
    asked: list[dict[str, list[str]]] = []
    page.on(
        "request",
        lambda r: asked.append(parse_qs(urlsplit(r.url).query)) if "/history" in r.url else None,
    )
    page.goto(f"{server.url}/#token={server.token}")
    page.goto(f"{server.url}/#/jobs/{job_id}")
    history = page.get_by_test_id("history")
    expect(history).to_contain_text("message 59", timeout=20_000)
    expect(history).to_contain_text(re.compile(r"still here .*still here"), timeout=20_000)
    expect(page.locator("#history-count")).to_contain_text("events")
    page.wait_for_timeout(3000)  # polls, one a second
    gate.touch()
    assert "after" not in asked[0]  # the first: the newest page
    later = [q for q in asked[1:] if "after" in q]
    assert len(later) >= 2, asked
    assert [int(q["after"][0]) for q in later] == sorted(int(q["after"][0]) for q in later)
    assert page.page_errors == []
