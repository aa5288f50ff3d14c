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
from trainguard.master.moves import STRICT_TRANSITIONS_ENV

# An illegal job or replica state move fails the test: the master raises (in production it
# records an internal error). The masters the CLI and the server start inherit it.
os.environ.setdefault(STRICT_TRANSITIONS_ENV, "1")

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
    """`cond()`'s first true value. Between two tries it sleeps as long as the last try
    took (at least 20 ms): a condition that runs the CLI (0.6 s of CPU) then holds at most
    half a core, not all of one, while the job it waits for needs the CPU."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        value = cond()
        if value:
            return value
        time.sleep(max(0.02, time.monotonic() - t0))
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


def _process_guard(item: pytest.Item) -> Iterator[None]:
    """While a test not marked slow sets up or runs, starting a process fails it: the fast
    tier must run in memory. Every way a process starts here goes through one of these."""
    import _posixsubprocess
    import multiprocessing.util  # noqa: F401 (spawn and forkserver use _posixsubprocess)

    tried: list[str] = []  # what the test tried to start, each saying how

    def refuse(how: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            what = f"{how}({args[1] if how == 'subprocess.Popen' else ''})"
            tried.append(what)
            pytest.fail(
                f"{item.nodeid} starts a process ({what}) but is not marked slow: "
                "the fast tier runs no real process; mark it `pytest.mark.slow`",
                pytrace=False,
            )

        return refused

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", refuse("subprocess.Popen"))
        mp.setattr(_posixsubprocess, "fork_exec", refuse("fork_exec"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                mp.setattr(os, name, refuse(f"os.{name}"))
        yield
    if tried:  # the code under test caught the failure: the test fails all the same
        pytest.fail(
            f"{item.nodeid} is not marked slow but starts processes: {tried}", pytrace=False
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow"):
        return (yield)
    yield from _process_guard(item)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if item.get_closest_marker("slow"):
        return (yield)
    yield from _process_guard(item)
    return None


# Families of tests that share something one machine has once (scripts/test.sh runs the
# suite on several xdist workers with `--dist loadgroup`): each family runs on one worker,
# one test at a time, so its module-scoped cluster starts once per file there.
_KERNEL_FILES = {"test_machine_e2e.py", "test_memory_limit_e2e.py", "test_machine_cgroup.py"}


def _serial_group(item: pytest.Item) -> str | None:
    names = getattr(item, "fixturenames", ())
    if item.get_closest_marker("ray") or "ray_cluster" in names:
        return "ray"  # the 3-node Ray cluster (and test_hosts.py's network namespaces)
    if item.get_closest_marker("slurm") or "slurm_cluster" in names:
        return "slurm"  # the 3-host Slurm cluster, on network namespaces
    if item.get_closest_marker("postgres"):
        return "postgres"  # one PostgreSQL server per worker that runs these
    if item.get_closest_marker("browser"):
        return "browser"  # Chromium, and test_web.py's fixed screenshot path in /tmp
    if item.get_closest_marker("slow") and (
        item.path.name in _KERNEL_FILES or "node_memory" in names
    ):
        return "kernel"  # v1 memory cgroups, OOM kills and the kernel log they all read
    if isinstance(item, pytest.Function) and any(
        d.scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values() for d in defs
    ):
        return item.path.name  # a file's module fixture (a baseline run, a model) made once
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    loadgroup = bool(getattr(config.option, "loadgroup", False))
    for item in items:
        if group := _serial_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
            if loadgroup and not hasattr(item, "_nodeid") and hasattr(item, "_id"):
                # xdist (3.8) hands the group to its scheduler as a suffix it writes to
                # `_nodeid`, which pytest 9.2's structured ids no longer read: without this,
                # the groups are silently ignored (pytest-dev/pytest-xdist#1386)
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(f"{item.nodeid}@{group}")
