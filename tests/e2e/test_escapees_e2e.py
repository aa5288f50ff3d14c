"""Processes a replica starts outside its process group end with it (issue 37): a child in a
new session, one in a new process group, a double-forked daemon, and a child that keeps the
output pipe, after the job SUCCEEDS, after a restart, after a cancel, and after the master
is SIGKILLed; cold and forked from the warm-start zygote."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import TG, alive, wait_for

pytestmark = pytest.mark.slow

SHAPES = ("session", "group", "daemon", "pipe")  # by rank

# A replica that leaves one escapee of the shape its rank names, writes the escapee's pid
# to DIR/<rank>.<attempt>, then does what the scenario asks.
ESCAPE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    out, then = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TRAINGUARD_RESTART_COUNT", "0"))
    shape = {shapes!r}[rank]
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)", "tg-escapee", out]
    quiet = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if shape == "session":
        pid = subprocess.Popen(sleeper, start_new_session=True, **quiet).pid
    elif shape == "group":
        pid = subprocess.Popen(sleeper, process_group=0, **quiet).pid
    elif shape == "pipe":  # keeps our stdout: the master's end of the pipe sees no EOF
        pid = subprocess.Popen(sleeper, start_new_session=True, stdin=subprocess.DEVNULL).pid
    else:  # the classic daemon: fork, setsid, fork again, the middle one exits
        r, w = os.pipe()
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.write(w, b"%d\\n" % os.getpid())
                fd = os.open(os.devnull, os.O_RDWR)
                for i in (0, 1, 2):
                    os.dup2(fd, i)
                os.closerange(3, 256)
                os.execv(sleeper[0], sleeper)
            os._exit(0)
        os.close(w)
        pid = int(os.read(r, 64).split()[0])
        os.wait()
    name = os.path.join(out, f"{{rank}}.{{attempt}}")
    with open(name + ".tmp", "w") as fh:
        fh.write(str(pid))
    os.rename(name + ".tmp", name)
    print(f"rank {{rank}} left a {{shape}} escapee", flush=True)
    names = [os.path.join(out, f"{{r}}.{{attempt}}") for r in range(len({shapes!r}))]
    while not all(map(os.path.exists, names)):  # every rank has left its own
        time.sleep(0.02)
    if then == "restart" and attempt == 0:
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    if then == "forever":
        while True:
            time.sleep(3600)
    """
).format(shapes=SHAPES)


def _escapees(out: Path, attempt: int) -> list[int]:
    files = [out / f"{rank}.{attempt}" for rank in range(len(SHAPES))]
    wait_for(lambda: all(f.is_file() for f in files), 60, f"the escapees of attempt {attempt}")
    return [int(f.read_text()) for f in files]


def _start(tg: TG, tmp_path: Path, then: str, warm: bool) -> tuple[Path, list[str]]:
    out = tmp_path / "escapees"
    out.mkdir()
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    flags = ["--preload", "json"] if warm else []
    argv = ["run", "--quiet", *flags, "--nproc-per-node", str(len(SHAPES))]
    return out, [*argv, "--", sys.executable, str(script), str(out), then]


def _all_gone(pids: list[int], what: str) -> None:
    try:
        wait_for(lambda: not any(alive(p) for p in pids), 15, what)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "forked"])
def test_escapees_end_when_the_job_succeeds(tg: TG, tmp_path: Path, warm: bool) -> None:
    out, argv = _start(tg, tmp_path, "exit", warm)
    res = tg(*argv)
    assert res.returncode == 0, res.stderr
    assert tg.only_job()["state"] == "SUCCEEDED"
    left = _escapees(out, 0)
    _all_gone(left, "every escapee to end with the job")


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "forked"])
def test_escapees_of_an_attempt_end_at_its_restart(tg: TG, tmp_path: Path, warm: bool) -> None:
    out, argv = _start(tg, tmp_path, "restart", warm)
    proc = tg.start(*argv)
    try:
        first = _escapees(out, 0)
        _escapees(out, 1)  # the next attempt is up: the first one's are gone already
        assert not [p for p in first if alive(p)]
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    _all_gone([*first, *_escapees(out, 1)], "every escapee to end with the job")


@pytest.mark.parametrize(
    ("sig", "warm"),
    [(signal.SIGTERM, False), (signal.SIGKILL, False), (signal.SIGKILL, True)],
    ids=["cancelled", "master-killed-cold", "master-killed-forked"],
)
def test_escapees_end_when_the_master_is_stopped_or_killed(
    tg: TG, tmp_path: Path, sig: int, warm: bool
) -> None:
    out, argv = _start(tg, tmp_path, "forever", warm)
    proc = tg.start(*argv)
    try:
        left = _escapees(out, 0)
    finally:
        os.kill(proc.pid, sig)  # SIGTERM cancels; after a SIGKILL, the guardian's sweep
        proc.wait(timeout=60)
    if sig == signal.SIGTERM:
        assert tg.only_job()["state"] == "CANCELLED"
    _all_gone(left, "every escapee to end with the job or its master")


def test_an_escapee_started_the_moment_the_replica_starts_ends_too(tg: TG, tmp_path: Path) -> None:
    """A shell replica that leaves a new session at once: it is inside its run's cgroup
    from its birth, so there is no window before the master could move it there."""
    out = tmp_path / "escapees"
    out.mkdir()
    leave = f"setsid -f sh -c 'echo $$ > {out}/$RANK; exec sleep 3600'; sleep 0.5"
    res = tg("run", "--quiet", "--nproc-per-node", "8", "--", "sh", "-c", leave)
    assert res.returncode == 0, res.stderr
    files = [out / str(rank) for rank in range(8)]
    wait_for(lambda: all(f.is_file() and f.read_text().strip() for f in files), 10, "pids")
    _all_gone([int(f.read_text()) for f in files], "every escapee to end with the job")
