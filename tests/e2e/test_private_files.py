"""The state home is its user's alone (issue 37): job specs hold environment values, logs
what the job printed. Folders 0700, files 0600, whatever the umask."""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TG, child, wait_for
from test_server import Server

from trainguard.records.schema import jobs
from trainguard.records.store import Store
from trainguard.storage.private import append_private, private_dir, tighten


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def _open_umask() -> Iterator[None]:
    """The usual umask: what is private must be made so, not inherited."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def _others_can_read(home: Path) -> list[str]:
    """Paths under `home` that another user could reach and read (or list)."""
    exposed = []
    for top, dirs, files in os.walk(home):
        folder = Path(top)
        reachable = all(_mode(p) & 0o011 for p in (folder, *folder.relative_to(home).parents))
        if not reachable:
            dirs[:] = []
            continue
        exposed += [str(folder / f) for f in files if _mode(folder / f) & 0o044]
        exposed += [str(folder / d) for d in dirs if _mode(folder / d) & 0o044]
    return exposed


def _not_private(home: Path) -> list[str]:
    """Paths under `home` with any access for group or others (each, whatever its parent):
    folders must be 0700, files 0600, so a folder opened up later exposes nothing."""
    found = []
    for top, dirs, files in os.walk(home):
        for name in (*dirs, *files):
            path = Path(top) / name
            if not path.is_symlink() and _mode(path) & 0o077:
                found.append(f"{path.relative_to(home)} {_mode(path):o}")
    return sorted(found)


def test_a_new_store_is_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    store = Store(home)
    store.insert(
        jobs,
        id="j",
        name="n",
        spec_json="{}",
        state="QUEUED",
        created_at_s=time.time(),
        log_dir="/x",
    )
    assert _mode(home) == 0o700 and _mode(home / "jobs") == 0o700
    for name in ("trainguard.db", "trainguard.db-wal", "trainguard.db-shm", "trainguard.lock"):
        assert _mode(home / name) == 0o600, name
    store.close()


def test_a_store_made_before_is_tightened(tmp_path: Path) -> None:
    home = tmp_path / "home"
    Store(home).close()
    for path in (home / "jobs", home / "trainguard.db", home / "trainguard.lock"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    Store(home).close()
    assert _mode(home / "jobs") == 0o700
    assert _mode(home / "trainguard.db") == _mode(home / "trainguard.lock") == 0o600


def test_a_sqlite_url_elsewhere_is_private_too(tmp_path: Path) -> None:
    db = tmp_path / "elsewhere" / "store.db"
    db.parent.mkdir()
    Store(tmp_path / "home", f"sqlite:///{db}").close()
    assert _mode(db) == 0o600


def test_folders_made_below_and_files_appended_to_are_private(tmp_path: Path) -> None:
    """A replica's log opens its attempt folder and the job's folder above it: each made
    private (a plain mkdir -p makes the parents by the umask); one made before is tightened
    by `tighten`, never by making a folder below it."""
    before = tmp_path / "home" / "jobs" / "old"
    before.mkdir(parents=True, mode=0o755)
    log = tmp_path / "home" / "jobs" / "j" / "attempt-0" / "worker-0.log"
    with append_private(log) as fh:
        fh.write(b"hello\n")
    private_dir(before)
    assert _mode(before) == 0o755  # a folder that exists keeps its mode
    tighten(before)
    assert _not_private(tmp_path / "home" / "jobs") == []
    assert _mode(log) == 0o600 and _mode(log.parent) == _mode(log.parent.parent) == 0o700


@pytest.mark.slow
def test_nothing_of_a_run_or_a_server_job_is_readable_by_others(tg: TG, tmp_path: Path) -> None:
    res = tg("run", "--env", "SECRET=hunter2", "--", *child("*:print:hello"))
    assert res.returncode == 0, res.stderr
    sdk = tg("run", "--", sys.executable, "-c", "import trainguard.sdk")  # its stacks file
    assert sdk.returncode == 0, sdk.stderr
    assert list(tg.home.glob("jobs/*/attempt-0/*.stacks.txt")), sorted(tg.home.rglob("*"))
    srv = Server(tg).start()
    try:
        assert _mode(tg.home / "server.json") == 0o600
        job_id = srv.submit("--env", "SECRET=hunter2", "--", *child("*:print:hello"))
        srv.wait_state(job_id, "SUCCEEDED")
        master_log = tg.home / "jobs" / job_id / "master.log"
        assert wait_for(master_log.is_file, 10, "the master's log")
        assert _mode(master_log) == 0o600
    finally:
        srv.stop()
    assert _mode(tg.home) == 0o700
    assert _others_can_read(tg.home) == []
    assert _not_private(tg.home) == [], "\n".join(_not_private(tg.home))


def test_a_folder_or_device_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    """A log at /dev/null must not make /dev (or /dev/null) private: a folder that exists
    is not tightened by what is made below it, and a device never is."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with append_private(shared / "x.log") as fh:
        fh.write(b"x")
    assert _mode(shared) == 0o755 and _mode(shared / "x.log") == 0o600
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o666)
    fifo.chmod(0o666)
    tighten(fifo)
    assert _mode(fifo) == 0o666
    null = Path("/dev/null")
    before = (_mode(null.parent), _mode(null))
    with append_private(null) as fh:
        fh.write(b"x")
    assert (_mode(null.parent), _mode(null)) == before
