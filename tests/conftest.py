"""Shared helpers: run the real CLI in a child process against a private state home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from postgres import postgres_url  # noqa: F401 (a session fixture for every test file)
from raycluster import ray_cluster  # noqa: F401 (a module fixture: a 3-node Ray cluster)

from trainguard.backends.local.tracking import alive as alive  # tests import it from here

ROOT = Path(__file__).resolve().parent.parent
CHILD = str(ROOT / "tests" / "bins" / "child.py")


class TG:
    """The `trainguard` CLI bound to one TRAINGUARD_HOME."""

    made: ClassVar[list[TG]] = []  # every one this test made: closed when it ends

    def __init__(self, home: Path, prefix: Sequence[str] = ()) -> None:
        """`prefix`: what each command runs through (e.g. a test host's `nsenter`)."""
        self.home = home
        self.prefix = list(prefix)
        self.env = {**os.environ, "TRAINGUARD_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.started: list[subprocess.Popen[str]] = []
        TG.made.append(self)

    def argv(self, *args: str) -> list[str]:
        return [*self.prefix, sys.executable, "-m", "trainguard", *args]

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        """Start the CLI in its own session, so signals sent to it reach it alone."""
        proc = subprocess.Popen(
            self.argv(*args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.started.append(proc)
        return proc

    def close(self) -> None:
        """What a test started and left: killed if still running, its pipes closed."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        self.started = []

    def json(self, *args: str) -> Any:
        res = self(*args, "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def status_or_none(self, job: str) -> dict[str, Any] | None:
        """`status --json` of a job, or None while it does not exist yet."""
        res = self("status", job, "--json")
        return json.loads(res.stdout) if res.returncode == 0 else None

    def only_job(self) -> dict[str, Any]:
        jobs = self.json("jobs")
        assert len(jobs) == 1, jobs
        status: dict[str, Any] = self.json("status", jobs[0]["id"])
        return status


@pytest.fixture
def tg(tmp_path: Path) -> Iterator[TG]:
    yield TG(tmp_path / "home")


@pytest.fixture(autouse=True)
def _close_clis() -> Iterator[None]:
    """Whatever CLI processes a test started, through `tg` or a TG of its own, end with it."""
    yield
    while TG.made:
        TG.made.pop().close()


def child(*actions: str) -> list[str]:
    return [sys.executable, CHILD, *actions]


def wait_for(cond: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text else None


def needs(missing: str | None, what: str) -> pytest.MarkDecorator:
    """Skip where a real part is missing (and say so), except under CI, where the tests
    run and fail instead: a missing install step must not pass green."""
    ci = os.environ.get("CI") == "true"
    if missing and not ci:
        print(f"{what}: skipped: {missing}", file=sys.stderr)
    return pytest.mark.skipif(missing is not None and not ci, reason=str(missing))
