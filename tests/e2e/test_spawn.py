"""Starting replicas: vfork (no preexec_fn), the guardian's cover of the spawn window, and
exits learnt from pidfds rather than a thread per child (local backend, Python 3.11)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TG, alive, child, wait_for

from trainguard.backends.childwatch import pidfd_child_watcher
from trainguard.backends.guardian import TOKEN_ENV, Guardian
from trainguard.backends.interface import BackendEvent, Launch, ReplicaExited, ReplicaStarted
from trainguard.backends.local.backend import LocalBackend

pytestmark = pytest.mark.slow  # real replicas and guardians


def _naming(marker: str) -> list[int]:
    """Live processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if marker.encode() in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- the real master


def test_the_master_keeps_few_threads_with_32_replicas(tg: TG, tmp_path: Path) -> None:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "32",
        "--",
        *child(f"*:pidfile:{pids}", "*:forever"),
    )
    try:
        wait_for(lambda: all(Path(f"{pids}.{r}").is_file() for r in range(32)), 120, "32 up")
        # A thread per child (asyncio's ThreadedChildWatcher) would make it 33 or more.
        assert _threads(proc.pid) < 8
    finally:
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    assert not _naming(str(tmp_path))


def test_a_master_killed_while_it_starts_replicas_leaves_none_behind(
    tg: TG, tmp_path: Path
) -> None:
    pids = tmp_path / "pid"
    proc = tg.start(
        "run",
        "--quiet",
        "--nproc-per-node",
        "48",
        "--",
        *child(f"*:pidfile:{pids}", "*:forever"),
    )
    try:
        wait_for(lambda: Path(f"{pids}.0").is_file(), 60, "the first replica")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # most likely while it is still starting the others
        proc.wait()
    marker = str(tmp_path)
    try:
        wait_for(lambda: not _naming(marker), 20, "no replica left")
    finally:
        _kill_all(_naming(marker))


# ---------------------------------------------------------------- no preexec_fn


def test_replicas_are_spawned_without_a_preexec_fn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any preexec_fn (or user/group change) makes CPython fork() the whole master
    instead of vfork(): slow for a large master, and unsafe with threads."""
    seen: list[dict[str, Any]] = []
    real = subprocess.Popen

    class Spy(real):  # type: ignore[misc, valid-type]  # a subclass of a variable
        def __init__(self, args: Any, *a: Any, **kw: Any) -> None:
            seen.append(kw)
            super().__init__(args, *a, **kw)

    monkeypatch.setattr(subprocess, "Popen", Spy)
    told: list[str] = []
    send = Guardian._send

    def spy_send(self: Guardian, line: str) -> None:
        told.append(line)
        send(self, line)

    monkeypatch.setattr(Guardian, "_send", spy_send)
    events: list[BackendEvent] = []

    async def scenario() -> None:
        backend = LocalBackend(tee=None)
        backend.bind(events.append)
        launch = Launch(
            attempt=0,
            replica="worker-0",
            rank=0,
            restart=0,
            argv=(sys.executable, "-c", f"import os; print(os.environ['{TOKEN_ENV}'])"),
            env={"PATH": os.environ.get("PATH", "")},
            cwd=str(tmp_path),
            log_path=tmp_path / "worker-0.log",
        )
        missing = dataclasses.replace(launch, replica="worker-1", argv=("no-such-tg",))
        await backend.start([launch, missing])
        started = next(e for e in events if isinstance(e, ReplicaStarted))
        for _ in range(500):
            if any(isinstance(e, ReplicaExited) and e.replica == "worker-0" for e in events):
                break
            await asyncio.sleep(0.02)
        assert backend._guardian is not None
        token = backend._guardian.token
        await backend.close()
        assert started.pid > 0
        assert (tmp_path / "worker-0.log").read_text().strip() == token

    asyncio.run(scenario())
    replica_spawns = [kw for kw in seen if kw.get("start_new_session") and "env" in kw]
    assert replica_spawns, seen
    for kw in replica_spawns:
        assert kw.get("preexec_fn") is None
        assert kw.get("user") is None and kw.get("group") is None
        assert kw.get("extra_groups") is None
    exited = {e.replica: e for e in events if isinstance(e, ReplicaExited)}
    assert exited["worker-0"].evidence.returncode == 0
    assert exited["worker-1"].evidence.spawn_error == "command not found: 'no-such-tg'"
    # every spawn announced to the guardian was answered: one made a group, one nothing
    pid = next(e.pid for e in events if isinstance(e, ReplicaStarted))
    spawns = [line for line in told if line[:1] in "?=."]
    assert spawns[:4] == ["?", f"={pid}", "?", "."], told


# ---------------------------------------------------------------- the guardian's window

# A stand-in master: starts a guardian, announces a spawn, starts the "replica" (a session
# of its own, the token in its environment, one grandchild in its group) and, in the
# window a master killed between fork and `=PID` would leave, never answers.
_MASTER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    sys.path.insert(0, {src!r})
    from trainguard.backends.guardian import TOKEN_ENV, Guardian
    g = Guardian()
    out = sys.argv[1]
    def start(cmd, token):
        env = dict(os.environ)
        if token:
            env[TOKEN_ENV] = token
        return subprocess.Popen(cmd, env=env, start_new_session=True).pid
    g.spawning()
    stray = start(["sh", "-c", "sleep 1000 & sleep 1000"], g.token)
    late = start(["sh", "-c", "sleep 1; exec env {env}=" + g.token + " sleep 1000"], None)
    decoy = start(["sleep", "1000"], "not-" + g.token)
    with open(out + ".tmp", "w") as fh:
        fh.write(f"{{g.pid}} {{stray}} {{late}} {{decoy}}")
    os.rename(out + ".tmp", out)
    time.sleep(1000)
    """
)


def test_a_master_killed_between_fork_and_answer_leaves_no_replica(tmp_path: Path) -> None:
    out = tmp_path / "pids"
    script = _MASTER.format(src=str(ROOT / "src"), env=TOKEN_ENV)
    master = subprocess.Popen([sys.executable, "-c", script, str(out)], start_new_session=True)
    try:
        wait_for(out.is_file, 30, "the stand-in master")
        guardian, stray, late, decoy = (int(x) for x in out.read_text().split())
        group = [stray, *_children(stray)]  # the shell and its sleep(s), one group
    finally:
        master.kill()
        master.wait()
    try:
        # the unanswered replica and its group, found by the token in its environment
        wait_for(lambda: not any(alive(p) for p in group), 10, "the stray group to die")
        # one that shows the token only a second later (a child still between vfork
        # and exec shows the master's environment) is found by the guardian's next looks
        wait_for(lambda: not alive(late), 10, "the late exec to die")
        wait_for(lambda: not alive(guardian), 15, "the guardian to finish")
        assert alive(decoy)  # another token: not ours
    finally:
        _kill_all([stray, late, decoy, *group])


def test_an_answered_spawn_is_a_watched_group_and_a_clean_close_scans_nothing(
    tmp_path: Path,
) -> None:
    g = Guardian()
    env = {**os.environ, TOKEN_ENV: g.token}
    g.spawning()
    watched = subprocess.Popen(["sleep", "1000"], env=env, start_new_session=True)
    g.spawned(watched.pid)
    g.spawning()
    g.spawned(None)  # a spawn that made nothing
    # carries the token but was never announced nor watched: a clean close leaves it
    unlisted = subprocess.Popen(["sleep", "1000"], env=env, start_new_session=True)
    try:
        t0 = time.monotonic()
        g.close()
        assert time.monotonic() - t0 < 2.5  # no stray search when every spawn was answered
        assert watched.wait(timeout=10) == -signal.SIGKILL
        assert unlisted.poll() is None
    finally:
        for p in (watched, unlisted):
            p.kill()
            p.wait()


# A stand-in master whose replica left an escapee in a session of its own (no listed group):
# by cgroup, the guardian is told the job's folder; without one, to look for the token.
_SWEEP_MASTER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    sys.path.insert(0, {src!r})
    from trainguard.backends.guardian import TOKEN_ENV, Guardian
    from trainguard.backends.local.cgroups import JobCgroups
    g = Guardian()
    out, how = sys.argv[1], sys.argv[2]
    env = {{**os.environ, TOKEN_ENV: g.token}}
    escapee = subprocess.Popen(["sleep", "1000"], env=env, start_new_session=True).pid
    folder = ""
    if how == "cgroup":
        job = JobCgroups.create(g.token)
        run = job.new_run()
        run.add(escapee)
        folder = str(job.folder)
        g.sweep_cgroups(folder)
    else:
        g.sweep_token()
    with open(out + ".tmp", "w") as fh:
        fh.write(f"{{g.pid}} {{escapee}} {{folder}}")
    os.rename(out + ".tmp", out)
    time.sleep(1000)
    """
)


@pytest.mark.parametrize("how", ["cgroup", "token"])
def test_a_killed_master_s_guardian_ends_what_left_the_groups(tmp_path: Path, how: str) -> None:
    out = tmp_path / "pids"
    script = _SWEEP_MASTER.format(src=str(ROOT / "src"))
    master = subprocess.Popen([sys.executable, "-c", script, str(out), how], start_new_session=True)
    try:
        wait_for(out.is_file, 30, "the stand-in master")
        guardian, escapee, *folder = out.read_text().split()
    finally:
        master.kill()
        master.wait()
    try:
        wait_for(lambda: not alive(int(escapee)), 10, "the escapee to die")
        wait_for(lambda: not alive(int(guardian)), 15, "the guardian to finish")
        assert not any(Path(f).exists() for f in folder)  # and the cgroups are removed
    finally:
        _kill_all([int(escapee)])


def _children(pid: int) -> list[int]:
    def kids() -> list[int]:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(x) for x in text.split()]

    return list(wait_for(kids, 10, f"a child of {pid}"))


# ---------------------------------------------------------------- the child watcher


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 uses pidfds by default")
def test_the_pidfd_watcher_reaps_children_without_threads() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with pidfd_child_watcher(loop):
            assert type(asyncio.get_child_watcher()).__name__ == "_PidfdWatcher"
            before = set(threading.enumerate())  # other tests' threads may end meanwhile
            procs = [
                await asyncio.create_subprocess_exec("sh", "-c", f"sleep 0.3; exit {i}")
                for i in range(16)
            ]
            assert set(threading.enumerate()) <= before  # no thread a child
            assert [await p.wait() for p in procs] == list(range(16))
            left = await asyncio.create_subprocess_exec("sleep", "0.5")
        # still running when the watcher is put back: handed over, still reaped
        assert isinstance(asyncio.get_child_watcher(), asyncio.ThreadedChildWatcher)
        assert await asyncio.wait_for(left.wait(), 10) == 0

    asyncio.run(scenario())


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 uses pidfds by default")
def test_a_child_without_a_pidfd_gets_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with pidfd_child_watcher(loop):

            def no_pidfd(pid: int, flags: int = 0) -> int:
                raise OSError(24, "Too many open files")

            monkeypatch.setattr(os, "pidfd_open", no_pidfd)
            proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 7")
            assert await asyncio.wait_for(proc.wait(), 10) == 7

    asyncio.run(scenario())
