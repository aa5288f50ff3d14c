"""In-memory snapshots (issue 16): whole files or none, one step every rank holds from one
attempt, never a torn or mismatched one; durable copies; the SDK round trip."""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path

import pytest

from trainguard import sdk
from trainguard.master.snapshot_keeper import SnapshotKeeper
from trainguard.storage import checkpoints, snapshots
from trainguard.storage.snapshots import KEEP, due, load, newest_complete, read, step_dir, write


def _all(root: Path, step: int, world: int = 2, attempt: int = 0) -> None:
    for rank in range(world):
        write(root, rank, world, attempt, step, pickle.dumps({"rank": rank, "step": step}))


def test_a_step_is_usable_once_every_rank_holds_it(tmp_path: Path) -> None:
    _all(tmp_path, 1)
    write(tmp_path, 0, 2, 0, 2, b"ahead")  # rank 0 is one step ahead of rank 1
    assert newest_complete(tmp_path, 2) == 1
    write(tmp_path, 1, 2, 0, 2, b"caught up")
    assert newest_complete(tmp_path, 2) == 2
    found = load(step_dir(tmp_path, 2), 1)
    assert found is not None and (found[0].step, bytes(found[1])) == (2, b"caught up")
    assert newest_complete(tmp_path, 3) is None  # a world of 3 never had rank 2


def test_a_torn_or_altered_file_is_never_offered(tmp_path: Path) -> None:
    _all(tmp_path, 1)
    _all(tmp_path, 2)
    path = step_dir(tmp_path, 2) / "rank_1.snap"
    data = path.read_bytes()
    path.write_bytes(data[:-3])  # torn: shorter than its header says
    assert read(path) is None and newest_complete(tmp_path, 2) == 1
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # one bit flipped
    assert read(path) is None and newest_complete(tmp_path, 2) == 1
    path.write_bytes(b"garbage")
    assert read(path) is None and newest_complete(tmp_path, 2) == 1
    path.write_bytes(data)
    assert newest_complete(tmp_path, 2) == 2


def test_files_of_two_attempts_do_not_make_a_step(tmp_path: Path) -> None:
    """Rank 0's step 5 of the attempt that failed, and rank 1's of the next: not one step."""
    _all(tmp_path, 4)
    write(tmp_path, 0, 2, 0, 5, b"old attempt")
    write(tmp_path, 1, 2, 1, 5, b"new attempt")
    assert newest_complete(tmp_path, 2) == 4


def test_each_rank_keeps_its_last_steps_only(tmp_path: Path) -> None:
    for step in range(1, 8):
        _all(tmp_path, step)
    assert snapshots.steps(tmp_path) == list(range(7, 7 - KEEP, -1))
    assert not any(n.startswith(".") for d in tmp_path.iterdir() for n in os.listdir(d))


def test_persist_links_a_complete_step_and_refuses_an_incomplete_one(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    _all(root, 3)
    stage = snapshots.persist(root, 3, 2, tmp_path / "stage")
    assert stage is not None and load(stage, 0) is not None and load(stage, 1) is not None
    write(root, 0, 2, 0, 4, b"alone")
    assert snapshots.persist(root, 4, 2, tmp_path / "stage4") is None
    assert not (tmp_path / "stage4").exists()


def test_durable_copies_every_n_steps_in_the_background(tmp_path: Path) -> None:
    """The keeper copies a due step once all ranks hold it; retention applies to copies."""
    from fakes import FakeBackend, make_master

    master, store = make_master(tmp_path, FakeBackend())

    async def go() -> SnapshotKeeper:
        keeper = SnapshotKeeper("j", tmp_path, master.keeper, 2, lambda _m: None)
        for step in (1, 2, 3, 4):
            _all(keeper.root, step)
            before = keeper._task
            keeper.on_snapshot("worker-0", step, 2)
            assert keeper._task is before  # one rank of two: nothing to copy yet
            keeper.on_snapshot("worker-1", step, 2)
            assert (keeper._task is not before) == (step % 2 == 0)
            if keeper._task is not None:
                await keeper._task
        await keeper.close()
        return keeper

    keeper = asyncio.run(go())
    asyncio.run(master.snapshots.close())
    store.close()
    assert [s for s, _ in keeper.persisted] == [2, 4]
    assert not keeper.root.exists()  # the memory is freed with the master
    newest = checkpoints.latest(keeper.keeper.storage)
    found = load(newest, 1) if newest is not None else None
    assert found is not None and found[1] == pickle.dumps({"rank": 1, "step": 4})
    assert newest is not None and (checkpoints.read_manifest(newest) or {})["step"] == 4
    assert due(40, 20) and not due(41, 20) and not due(40, 0)


def test_the_sdk_offers_memory_first_and_durable_when_it_is_newer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm, storage = tmp_path / "shm", tmp_path / "ck"
    monkeypatch.setenv(sdk.ENV_SNAPSHOT_DIR, str(shm))
    monkeypatch.setenv(sdk.ENV_CHECKPOINT_DIR, str(storage))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    sdk._reset_for_tests()
    assert sdk.get_checkpoint() is None and sdk.load_snapshot() is None
    sdk.snapshot({"w": [1.0, 2.0]}, 7)  # not a step the master copies: nothing to tell it
    monkeypatch.setenv(sdk.ENV_SNAPSHOT_PERSIST_EVERY, "3")
    with pytest.warns(sdk.SdkWarning):  # no master to tell: the snapshot is still kept
        sdk.snapshot({"w": [0.0]}, 6)
    assert sdk.load_snapshot() is None  # rank 0 has not stored step 7
    write(shm, 0, 2, 0, 7, pickle.dumps({"w": [1.0, 2.0]}))
    assert sdk.get_checkpoint() == str(step_dir(shm, 7))
    assert sdk.load_snapshot() == (7, {"w": [1.0, 2.0]})
    folder = tmp_path / "reported"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w")
    newer = checkpoints.commit(folder, storage, step=9)
    assert sdk.get_checkpoint() == str(storage / newer)  # a later durable one wins
    assert sdk.load_snapshot() is None  # and holds no snapshot
    with pytest.raises(ValueError, match="step"):
        sdk.snapshot({}, -1)


def test_a_dead_masters_snapshots_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshots, "SHM", tmp_path / "no-shm-here")  # then: the job folder
    dead = tmp_path / "trainguard-old"
    dead.mkdir()
    (dead / snapshots.OWNER).write_text("999999999")  # no such process
    other = tmp_path / "trainguard-foreign"
    other.mkdir()  # no owner file: left alone
    live = snapshots.make_root("new", tmp_path)
    assert live == tmp_path / "trainguard-new" and live.is_dir()
    assert not dead.exists() and other.exists()
    assert (live / snapshots.OWNER).read_text() == str(os.getpid())


def _pickled(value: object) -> list[tuple[int, snapshots.Copy]]:
    data = pickle.dumps(value)

    def fill(view: memoryview) -> None:
        view[:] = data

    return [(len(data), fill)]


def test_a_rank_rewrites_its_oldest_file_in_place(tmp_path: Path) -> None:
    w = snapshots.Writer(tmp_path, 0)
    inodes = {}
    for step in range(1, 10):
        path = w.write(1, 0, step, _pickled({"step": step}))
        w.wait()
        inodes[step] = path.stat().st_ino
    assert snapshots.steps(tmp_path) == [9, 8, 7]
    assert inodes[9] == inodes[6] == inodes[3]  # the same memory, step after step
    found = load(step_dir(tmp_path, 9), 0)
    assert found is not None and pickle.loads(found[1]) == {"step": 9}
    assert newest_complete(tmp_path, 1) == 9
    w.close()


def test_a_rank_that_dies_while_copying_leaves_nothing_to_take(tmp_path: Path) -> None:
    w = snapshots.Writer(tmp_path, 0)
    for step in (1, 2, 3):
        w.write(1, 0, step, _pickled(step))
    w.wait()

    def dies(view: memoryview) -> None:
        view[:10] = b"x" * 10
        raise SystemExit("killed mid-copy")

    with pytest.raises(SystemExit):
        w.write(1, 0, 4, [(100, dies)])  # reuses step 1's file: it was marked invalid first
    assert read(step_dir(tmp_path, 4) / "rank_0.snap") is None
    assert newest_complete(tmp_path, 1) == 3
    w.close()


def test_a_step_the_master_copies_is_never_rewritten(tmp_path: Path) -> None:
    """The keeper hard-links a due step's files: later steps must not write into them."""
    w = snapshots.Writer(tmp_path, 0)
    w.write(1, 0, 1, _pickled("due"), reusable=False)
    w.wait()
    stage = tmp_path.parent / f"{tmp_path.name}-stage"
    stage.mkdir()
    os.link(step_dir(tmp_path, 1) / "rank_0.snap", stage / "rank_0.snap")
    w.write(1, 0, 2, _pickled("linked later"))  # reusable, but linked: left alone
    w.wait()
    os.link(step_dir(tmp_path, 2) / "rank_0.snap", stage / "late.snap")
    for step in range(3, 9):
        w.write(1, 0, step, _pickled(step))
    w.close()
    kept = read(stage / "rank_0.snap")
    assert kept is not None and pickle.loads(kept[1]) == "due"
    late = read(stage / "late.snap")
    assert late is not None and pickle.loads(late[1]) == "linked later"
    assert snapshots.steps(tmp_path) == [8, 7, 6]


def test_a_state_that_grows_gets_a_larger_file(tmp_path: Path) -> None:
    w = snapshots.Writer(tmp_path, 0)
    for step, size in enumerate((10, 10, 10, 100_000, 10), start=1):
        w.write(1, 0, step, _pickled(b"x" * size))
    w.close()
    found = load(step_dir(tmp_path, 4), 0)
    assert found is not None and pickle.loads(found[1]) == b"x" * 100_000


def test_a_large_state_is_committed_in_the_background(tmp_path: Path) -> None:
    w = snapshots.Writer(tmp_path, 0)
    big = os.urandom(snapshots.INLINE_COMMIT + 1)
    w.write(1, 0, 1, _pickled(big))
    w.wait()  # the CRC and the header came from the thread
    found = load(step_dir(tmp_path, 1), 0)
    assert found is not None and pickle.loads(found[1]) == big
    w.close()
