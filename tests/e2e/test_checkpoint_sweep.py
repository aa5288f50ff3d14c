"""What a replica killed mid-copy leaves in the checkpoint storage is swept by the next
commit and by retention, and a copy a live writer holds never is (issue 37)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, TG

from trainguard.storage import checkpoint_copy as cc
from trainguard.storage import checkpoints as ck

KILLED = str(ROOT / "tests" / "bins" / "ckpt_killed_mid_copy.py")


def _folder(where: Path, files: int = 3, size: int = 1_000_000) -> Path:
    where.mkdir(parents=True)
    for i in range(files):
        (where / f"part{i}.bin").write_bytes(os.urandom(size))
    return where


def _incoming(storage: Path) -> list[str]:
    return sorted(p.name for p in storage.glob(".incoming-*"))


def _hanging_writer(tmp_path: Path, storage: Path, name: str) -> subprocess.Popen[bytes]:
    """A real replica process stopped in the middle of its checkpoint's copy."""
    marker = tmp_path / f"{name}.copying"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["TRAINGUARD_CHECKPOINT_DIR"] = str(storage)
    proc = subprocess.Popen(
        [sys.executable, KILLED, str(_folder(tmp_path / name)), str(marker), "hang"], env=env
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the writer never copied"
        time.sleep(0.05)
    return proc


@pytest.mark.slow
def test_a_live_writers_copy_stays_and_a_killed_ones_goes(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    ck.commit(_folder(tmp_path / "first", 1, 10), storage)
    writer = _hanging_writer(tmp_path, storage, "big")
    try:
        partial = _incoming(storage)
        assert len(partial) == 2  # the copy and its lock file
        (copy,) = [storage / n for n in partial if not n.endswith(".lock")]
        assert [p.name for p in copy.iterdir()] == ["part0.bin"]  # one file of three
        # another writer commits, retention runs: the live copy is left alone
        ck.commit(_folder(tmp_path / "second", 1, 10), storage)
        assert ck.apply_retention(storage, keep_last=1) == ["checkpoint_000001"]
        assert _incoming(storage) == partial
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    name = ck.commit(_folder(tmp_path / "third", 1, 10), storage)  # the next commit sweeps
    assert _incoming(storage) == [] and name == "checkpoint_000003"
    # and retention sweeps too
    writer = _hanging_writer(tmp_path, storage, "big2")
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert len(_incoming(storage)) == 2
    gone = ck.apply_retention(storage, keep_last=1)
    assert gone[0] == "checkpoint_000002" and gone[1].startswith(".incoming-")
    assert _incoming(storage) == []
    assert [e.name for e in ck.entries(storage)] == ["checkpoint_000003"]


@pytest.mark.slow
def test_replicas_killed_mid_copy_leave_nothing_behind(tg: TG, tmp_path: Path) -> None:
    """Three attempts SIGKILLed during `sdk.report(checkpoint=...)`; the fourth commits."""
    folder = _folder(tmp_path / "ckpt")
    res = tg(
        "run",
        "--quiet",
        "--",
        sys.executable,
        KILLED,
        str(folder),
        str(tmp_path / "unused"),
        "die",
        "3",
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 4)
    storage = Path(job["log_dir"]) / "checkpoints"
    assert _incoming(storage) == []
    assert [e.name for e in ck.entries(storage)] == ["checkpoint_000001"]
    assert ck.verify(storage, "checkpoint_000001")


# ---------------------------------------------------------------- who owns a copy


def _left(storage: Path, owner: object, age_s: float = 0.0) -> Path:
    """A copy and its lock file as a writer leaves them, its lock not held."""
    copy = storage / ".incoming-test"
    copy.mkdir(parents=True)
    (copy / "part0.bin").write_bytes(b"x")
    lock = storage / ".incoming-test.lock"
    lock.write_text(json.dumps(owner) if owner is not None else "")
    then = time.time() - age_s
    for p in (copy / "part0.bin", copy, lock):
        os.utime(p, (then, then))
    return copy


def _me(**changes: object) -> dict[str, object]:
    return {**cc._me(), **changes}


def test_a_held_lock_is_a_live_writer(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    storage.mkdir()
    with cc.Incoming(storage) as live:
        assert cc.sweep(storage, now_s=time.time() + 10 * cc.QUIET_S) == []
        assert live.path.is_dir()
    assert _incoming(storage) == []  # closed: its copy and lock are gone


def test_a_dead_writer_on_this_machine_is_known_by_its_pid(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    _left(storage, _me(start=-1))  # the pid runs, but started at another time: reused
    assert cc.sweep(storage) == [".incoming-test"]
    assert _incoming(storage) == []


def test_a_free_lock_with_its_writer_running_here_is_kept(tmp_path: Path) -> None:
    """A folder whose locks do not work: the writer's pid is alive, its copy stays."""
    storage = tmp_path / "store"
    _left(storage, _me(), age_s=10 * cc.QUIET_S)
    assert cc.sweep(storage) == []
    assert len(_incoming(storage)) == 2


@pytest.mark.parametrize("owner", [_me(host="elsewhere/boot"), None, "garbage"])
def test_another_machines_copy_goes_once_nothing_was_written_to_it(
    tmp_path: Path, owner: object
) -> None:
    storage = tmp_path / "store"
    _left(storage, owner, age_s=cc.QUIET_S / 2)
    assert cc.sweep(storage) == []  # it may be copying still
    assert cc.sweep(storage, now_s=time.time() + cc.QUIET_S) == [".incoming-test"]
    assert _incoming(storage) == []


def test_a_copy_from_before_locks_goes_once_old(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    copy = _left(storage, None, age_s=cc.QUIET_S / 2)
    (storage / ".incoming-test.lock").unlink()
    assert cc.sweep(storage) == []
    assert cc.sweep(storage, now_s=time.time() + cc.QUIET_S) == [".incoming-test"]
    assert not copy.exists()


def test_an_upload_killed_before_its_manifest_does_not_block_the_next(tmp_path: Path) -> None:
    """Its folder without a manifest held the next number: commit tried it forever."""
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://trainguard-test-{tmp_path.name}/killed"
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/checkpoint_000001/part0.bin", b"uploaded, manifest not yet")
    name = ck.commit(_folder(tmp_path / "next", 1, 10), url)
    assert name == "checkpoint_000002" and [e.name for e in ck.entries(url)] == [name]
