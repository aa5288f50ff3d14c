"""The web page in a real browser (Debian's Chromium via Playwright), on a real server.

A job hangs once and recovers while the page watches it; a server with a token refuses the
page until the token comes in the URL fragment; the page cancels a running job; the page
says so when the server goes away.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import TG, alive, child, wait_for

CHROMIUM = "/usr/bin/chromium"
SCREENSHOT_COPY = Path("/tmp/trainguard-web.png")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "INTERRUPTED"}

pytestmark = [pytest.mark.slow, pytest.mark.browser]

# A replica that reports a step every 0.1 s. On attempt 0, at step HANG_AT, rank 1 stalls
# outside any collective while rank 0 waits in "all_reduce": a hang whose stacks name
# worker-1 the culprit. Attempt 1 runs through.
TRAIN = """\
import os, sys, time
from trainguard import sdk

rank = int(os.environ.get("RANK", "0"))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
steps, hang_at = int(sys.argv[1]), int(sys.argv[2])


def all_reduce_gradients():
    time.sleep(60)


def load_next_batch():
    time.sleep(60)


print(f"worker {rank}: attempt {attempt}, starting", flush=True)
for step in range(1, steps + 1):
    sdk.report({"step": step, "loss": round(2.0 / step, 4)})
    if step % 5 == 0:
        print(f"worker {rank}: step {step} loss {2.0 / step:.3f}", flush=True)
    if attempt == 0 and step == hang_at:
        print(f"worker {rank}: stuck at step {step}", flush=True)
        load_next_batch() if rank == 1 else all_reduce_gradients()
    time.sleep(0.1)
print(f"worker {rank}: done", flush=True)
"""


class Server:
    """`trainguard server` on a free port, in its own session, with a private home."""

    def __init__(self, home: Path, token: str | None = None) -> None:
        self.home = home
        self.token = token
        self.tg = TG(home)
        for name in ("TRAINGUARD_TOKEN", "TRAINGUARD_SERVER"):
            self.tg.env.pop(name, None)
        flags = [f"--token={token}"] if token else []
        self.log = home.parent / f"{home.name}-server.log"
        home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                self.tg.argv("--home", str(home), "server", "--port", "0", "--cpus", "4", *flags),
                env=self.tg.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        info = home / "server.json"
        wait_for(lambda: info.is_file() or self.proc.poll() is not None, 30, "server.json")
        assert self.proc.poll() is None, f"the server exited: {self.log.read_text()}"
        data = json.loads(info.read_text())
        assert data["pid"] == self.proc.pid
        self.url: str = data["url"]
        # no token given: the server made one in its home (0600), as for any user
        self.token = token or (home / "server.token").read_text().strip()
        self.pids: set[int] = set()  # masters and replicas seen: none may outlive the test

    def api(self, method: str, path: str) -> Any:
        req = urllib.request.Request(self.url + path, data=b"{}" if method == "POST" else None)
        req.method = method
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def submit(self, *args: str) -> str:
        extra = [f"--token={self.token}"] if self.token else []
        res = self.tg("--home", str(self.home), "submit", "--server", self.url, *extra, *args)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    def note_pids(self) -> None:
        for job in self.api("GET", "/api/jobs?limit=1000"):
            view = self.api("GET", f"/api/jobs/{job['id']}")
            self.pids.update(p for p in [view["master_pid"]] if p)
            self.pids.update(r["pid"] for r in view["replicas"] if r["pid"])

    def stop(self) -> None:
        """Cancel what still runs, wait for its processes to end, then SIGTERM the server."""
        if self.proc.poll() is None:
            self.note_pids()
            for job in self.api("GET", "/api/jobs?limit=1000"):
                if job["state"] not in TERMINAL:
                    self.api("POST", f"/api/jobs/{job['id']}/cancel")

            def all_ended() -> bool:
                jobs = self.api("GET", "/api/jobs?limit=1000")
                return all(j["state"] in TERMINAL for j in jobs)

            wait_for(all_ended, 45, "every job to end after cancel")
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("the server did not stop on SIGTERM") from None
        left = [p for p in self.pids if p != os.getpid()]
        try:
            wait_for(lambda: not any(alive(p) for p in left), 20, "masters and replicas to exit")
        except AssertionError:
            for p in left:
                if alive(p):
                    os.kill(p, signal.SIGKILL)
            raise


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's Chromium "
            "(apt-get install chromium)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright's Python client: pip install playwright")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(10_000)
    pg.page_errors = []  # uncaught exceptions in the page's own script
    pg.on("pageerror", lambda exc: pg.page_errors.append(str(exc)))
    yield pg
    context.close()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    problems = []
    for s in started:
        try:
            s.stop()
        except Exception as exc:  # stop the others too, then report
            problems.append(f"{s.url}: {exc}; server log:\n{s.log.read_text()}")
    assert not problems, "\n".join(problems)


def test_job_page_follows_a_job_that_hangs_once_and_recovers(
    servers: list[Server], page: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    server = Server(tmp_path / "home")
    servers.append(server)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    job_id = server.submit(
        "--job-name",
        "web-demo",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--job-hang-interval",
        "2",
        "--",
        sys.executable,
        str(script),
        "30",
        "12",
    )
    api_calls: list[tuple[float, str]] = []

    def note(r: Any) -> None:
        if "/api/" in r.url:
            api_calls.append((time.monotonic(), r.url))

    page.on("request", note)

    # the list, then the job page through its link (hash routing, same document)
    page.goto(f"{server.url}/#token={server.token}")
    page.evaluate("window.__sameDocument = true")
    row = page.locator(f'[data-testid="job-row"][data-job-id="{job_id}"]')
    expect(row).to_be_visible()
    expect(row.get_by_test_id("job-link")).to_have_text("web-demo")
    row.get_by_test_id("job-link").click()
    expect(page).to_have_url(re.compile(f"#/jobs/{job_id}$"))

    state = page.get_by_test_id("job-state")
    expect(state).to_have_text("RUNNING", timeout=15_000)
    expect(page.get_by_test_id("cancel")).to_be_enabled()
    expect(page.get_by_test_id("resume")).to_be_disabled()
    expect(page.get_by_test_id("job-step")).to_have_text(re.compile(r"^\d+$"))

    record = page.get_by_test_id("restart-record")
    expect(record).to_have_count(1, timeout=20_000)
    expect(record.get_by_test_id("restart-replica")).to_have_text("worker-1")
    expect(record.get_by_test_id("restart-class")).to_have_text("hang")
    expect(record).to_contain_text("RestartJob")  # the decision
    expect(record).to_contain_text("detect")  # phase times
    expect(record).to_contain_text("first output")

    expect(state).to_have_text("SUCCEEDED", timeout=25_000)
    done_at = time.monotonic()
    assert page.evaluate("window.__sameDocument") is True  # live updates, no reload

    # while it ran the page polled about every second; once terminal, a slow refresh only
    job_calls = [t for t, url in api_calls if f"/api/jobs/{job_id}" in url]
    assert len(job_calls) >= 3 * 7, len(job_calls)  # 7 requests a round
    page.wait_for_timeout(2500)
    assert len([t for t, url in api_calls if t > done_at + 0.5]) <= 7

    expect(page.get_by_test_id("cancel")).to_be_disabled()
    expect(page.get_by_test_id("resume")).to_be_disabled()
    expect(page.get_by_test_id("job-attempts")).to_have_text("2")
    expect(page.get_by_test_id("job-restarts")).to_have_text("1")
    expect(page.get_by_test_id("job-step")).to_have_text("30")

    replicas = page.get_by_test_id("replica-row")
    expect(replicas).to_have_count(2)
    expect(replicas.nth(0)).to_contain_text("worker-0")
    expect(replicas.nth(0).get_by_test_id("replica-state")).to_have_text("SUCCEEDED")
    expect(replicas.nth(1)).to_contain_text("worker-1")

    faults = page.get_by_test_id("fault-row")
    expect(faults).to_have_count(1)
    expect(faults).to_contain_text("worker-1")

    chart = page.get_by_test_id("goodput-chart")
    expect(chart).to_be_visible()
    expect(chart.locator('rect[data-part="productive"]')).to_have_count(1)
    expect(page.get_by_test_id("goodput-value")).to_have_text(re.compile(r"^\d+(\.\d)?%$"))
    expect(page.get_by_test_id("progress-chart")).to_be_visible()

    snapshot = page.get_by_test_id("snapshot")
    expect(snapshot).to_have_count(1)
    expect(snapshot.get_by_test_id("culprit")).to_have_text("worker-1")
    expect(snapshot.locator("tr.culprit")).to_have_count(1)
    expect(snapshot.locator("tr.culprit")).to_contain_text("worker-1")
    expect(snapshot.locator('tr[data-replica="worker-0"]')).not_to_have_class(re.compile("culprit"))

    log = page.get_by_test_id("log-tail")
    expect(log).to_contain_text("worker 0: attempt 1, starting")  # the primary's by default
    replicas.nth(1).click()
    expect(log).to_contain_text("worker 1: attempt 1, starting")
    page.get_by_test_id("log-attempt").select_option("0")
    expect(log).to_contain_text("worker 1: stuck at step 12")

    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "trainguard-web.png"
    page.screenshot(path=str(shot), full_page=True)
    shutil.copyfile(shot, SCREENSHOT_COPY)
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000

    # back to the list: the job's row is up to date
    page.locator("#nav-jobs").click()
    expect(row.get_by_test_id("job-row-state")).to_have_text("SUCCEEDED")
    expect(row.get_by_test_id("job-row-step")).to_have_text("30")
    expect(row.get_by_test_id("job-row-attempts")).to_have_text("2")
    assert page.page_errors == []
    server.note_pids()


def test_token_cancel_and_a_server_that_goes_away(
    servers: list[Server], page: Any, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    server = Server(tmp_path / "home", token="secret")
    servers.append(server)
    error = page.get_by_test_id("error")

    page.goto(server.url + "/")
    expect(error).to_be_visible()
    expect(error).to_contain_text("needs a token")
    expect(page.get_by_test_id("token-form")).to_be_visible()
    expect(page.get_by_test_id("conn")).to_have_text("token needed")

    job_id = server.submit(
        "--job-name", "sleeper", "--", *child("*:print:sleeping {rank}", "*:sleep:60")
    )
    page.goto(server.url + "/#token=secret")
    expect(error).to_be_hidden()
    expect(page).to_have_url(re.compile(r"#/$"))  # the token left the address bar
    row = page.locator(f'[data-testid="job-row"][data-job-id="{job_id}"]')
    expect(row).to_be_visible()
    page.reload()  # the token stays for the session
    expect(row).to_be_visible()
    expect(error).to_be_hidden()

    row.get_by_test_id("job-link").click()
    state = page.get_by_test_id("job-state")
    expect(state).to_have_text("RUNNING", timeout=15_000)
    server.note_pids()
    expect(page.get_by_test_id("log-tail")).to_contain_text("sleeping 0")
    page.get_by_test_id("cancel").click()
    expect(page.get_by_test_id("notice")).to_contain_text("cancel requested")
    expect(state).to_have_text("CANCELLED", timeout=30_000)
    expect(page.get_by_test_id("cancel")).to_be_disabled()
    expect(page.get_by_test_id("resume")).to_be_enabled()

    # the server goes away: the list (polling every few seconds) says so
    page.locator("#nav-jobs").click()
    expect(row.get_by_test_id("job-row-state")).to_have_text("CANCELLED")
    server.stop()
    down = re.compile("cannot reach the trainguard server", re.IGNORECASE)
    expect(error).to_contain_text(down, timeout=15_000)
    expect(page.get_by_test_id("conn")).to_have_text("offline")
    assert page.page_errors == []
