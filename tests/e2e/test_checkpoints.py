"""Checkpoints committed atomically, verified, retained; report/get_checkpoint for real."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TG

from trainguard.storage import checkpoints as ck
from trainguard.storage.checkpoints import Entry, to_keep


def _folder(tmp_path: Path, name: str, text: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "model.bin").write_text(text)
    (d / "sub").mkdir()
    (d / "sub" / "opt.bin").write_text(text * 2)
    return d


def test_commit_is_numbered_complete_and_verified(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    a = ck.commit(_folder(tmp_path, "a", "1"), storage, step=10, metrics={"loss": 0.5})
    b = ck.commit(_folder(tmp_path, "b", "2"), storage, step=20)
    assert (a, b) == ("checkpoint_000001", "checkpoint_000002")
    assert (storage / b / "sub" / "opt.bin").read_text() == "22"
    assert ck.verify(storage, a) and ck.verify(storage, b)
    assert [e.step for e in ck.entries(storage)] == [10, 20]
    assert not list(storage.glob(".incoming-*"))  # nothing half-written left behind
    assert ck.latest(storage) == storage / b
    manifest = ck.manifest_of(storage, b)
    assert manifest is not None and ck.commit_ms(manifest) is not None


def test_a_corrupt_or_unloadable_checkpoint_is_skipped(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    first = ck.commit(_folder(tmp_path, "a", "1"), storage)
    second = ck.commit(_folder(tmp_path, "b", "2"), storage)
    (storage / second / "model.bin").write_text("torn write")
    assert not ck.verify(storage, second)
    assert ck.latest(storage) == storage / first
    third = ck.commit(_folder(tmp_path, "c", "3"), storage)
    assert ck.latest(storage) == storage / third
    ck.mark_bad(storage, third)  # the training code could not load it
    assert ck.latest(storage) == storage / first


def test_a_folder_without_manifest_is_not_a_checkpoint(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    (storage / "checkpoint_000009").mkdir(parents=True)
    assert ck.entries(storage) == [] and ck.latest(storage) is None
    with pytest.raises(FileNotFoundError):
        ck.commit(tmp_path / "missing", storage)


def test_an_fsspec_url_works_the_same(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")  # an optional extra: in CI's test extras
    url = f"memory://trainguard-test-{tmp_path.name}/ckpts"
    a = ck.commit(_folder(tmp_path, "a", "1"), url, step=1, metrics={"loss": 0.9})
    b = ck.commit(_folder(tmp_path, "b", "2"), url, step=2, metrics={"loss": 0.1})
    assert [e.name for e in ck.entries(url)] == [a, b]
    local = ck.latest(url)
    assert local is not None and (local / "sub" / "opt.bin").read_text() == "22"
    ck.mark_bad(url, b)
    older = ck.latest(url)
    assert older is not None and (older / "model.bin").read_text() == "1"
    c = ck.commit(_folder(tmp_path, "c", "3"), url, step=3, metrics={"loss": 0.5})
    gone = ck.apply_retention(
        url, keep_last=1, keep_best=1, score_attribute="loss", score_order="min"
    )
    assert gone == [a] and [e.name for e in ck.entries(url)] == [b, c]


def test_a_remote_checkpoint_without_its_manifest_does_not_exist(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://trainguard-test-{tmp_path.name}/half"
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/checkpoint_000001/model.bin", b"uploaded, manifest not yet")
    assert ck.entries(url) == [] and ck.latest(url) is None


def _entries(*losses: float) -> list[Entry]:
    return [Entry(f"checkpoint_{i:06d}", i, i, {"loss": x}) for i, x in enumerate(losses, 1)]


@pytest.mark.parametrize(
    ("kw", "kept"),
    [
        ({"keep_last": 2}, [4, 5]),
        (
            {"keep_last": 1, "keep_best": 2, "score_attribute": "loss", "score_order": "min"},
            [2, 3, 5],
        ),
        ({"keep_last": 1, "keep_best": 1, "score_attribute": "loss", "score_order": "max"}, [1, 5]),
        ({"keep_last": 1, "keep_best": 2, "score_attribute": "acc"}, [5]),  # no such metric
    ],
)
def test_retention_keeps_the_latest_and_the_best(kw: dict[str, object], kept: list[int]) -> None:
    names = to_keep(_entries(0.9, 0.1, 0.2, 0.8, 0.7), **kw)  # type: ignore[arg-type]
    assert names == [f"checkpoint_{i:06d}" for i in kept]


def test_retention_writes_the_index_then_deletes(tmp_path: Path) -> None:
    storage = tmp_path / "store"
    for i in range(5):
        ck.commit(_folder(tmp_path, f"f{i}", str(i)), storage, metrics={"loss": i})
    gone = ck.apply_retention(storage, keep_last=2)
    assert gone == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    index = json.loads((storage / "index.json").read_text())
    assert index == {"checkpoints": ["checkpoint_000004", "checkpoint_000005"]}
    assert sorted(p.name for p in storage.glob("checkpoint_*")) == index["checkpoints"]


@pytest.mark.slow
def test_report_and_get_checkpoint_lose_nothing_across_a_kill(tg: TG, tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    steps = 12
    res = tg(
        "run",
        "--quiet",
        "--nproc",
        "2",
        "--inject",
        "signal:worker-0:SIGKILL@step=5",
        "--",
        sys.executable,
        str(ROOT / "tests" / "bins" / "sdk_train.py"),
        str(steps),
        str(result),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(result.read_text())
    assert out["total"] == sum(range(1, steps + 1))  # nothing lost, nothing counted twice
    assert out["resumed_from"] >= 4
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2)
    assert job["progress"]["step"] == steps and job["progress"]["metrics"]["step"] == steps
    storage = Path(job["log_dir"]) / "checkpoints"
    kept = json.loads((storage / "index.json").read_text())["checkpoints"]
    assert len(kept) == 3  # keep_last defaults to 3
    assert sorted(p.name for p in storage.glob("checkpoint_*")) == kept


@pytest.mark.slow
def test_outside_trainguard_report_and_get_checkpoint_do_nothing(tmp_path: Path) -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    code = (
        "from trainguard import sdk; print(sdk.get_checkpoint()); "
        "sdk.report({'step': 1}, checkpoint='/no/such/folder'); print('ok')"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["None", "ok"]
    assert res.stderr.count("SdkWarning") == 1


@pytest.mark.slow
def test_a_new_job_can_start_from_a_given_checkpoint(tg: TG, tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "state.json").write_text(json.dumps({"step": 9, "total": 45}))
    result = tmp_path / "result.json"
    script = str(ROOT / "tests" / "bins" / "sdk_train.py")
    res = tg(
        "run",
        "--quiet",
        "--from-checkpoint",
        str(seed),
        "--",
        sys.executable,
        script,
        "12",
        str(result),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(result.read_text())
    assert out == {"total": sum(range(1, 13)), "resumed_from": 9}
    res = tg("run", "--from-checkpoint", str(tmp_path / "nope"), "--", "true")
    assert res.returncode == 2 and "--from-checkpoint: not a folder" in res.stderr


def test_an_empty_folder_is_not_a_checkpoint(tmp_path: Path) -> None:
    storage, empty = tmp_path / "store", tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="holds no files"):
        ck.commit(empty, storage)
    # a manifest that lists no files (written by hand, or by an older writer) is refused too
    (storage / "checkpoint_000001").mkdir(parents=True)
    (storage / "checkpoint_000001" / ck.MANIFEST).write_text(json.dumps({"files": {}}))
    assert not ck.verify(storage, "checkpoint_000001")
    assert ck.latest(storage) is None


def test_a_report_naming_an_uncommitted_checkpoint_is_refused(tmp_path: Path) -> None:
    from trainguard.errors import CallRefused
    from trainguard.master.keeper import CheckpointKeeper
    from trainguard.spec.models import CheckpointPolicy

    class Rec:
        def __init__(self) -> None:
            self.calls: list[tuple[object, ...]] = []

        def __getattr__(self, name: str) -> object:
            return lambda *a: self.calls.append((name, *a))

    rec = Rec()
    keeper = CheckpointKeeper(CheckpointPolicy(), tmp_path, rec)  # type: ignore[arg-type]
    keeper.new_attempt(0)
    with pytest.raises(CallRefused, match="checkpoint_000004 is not a committed checkpoint"):
        keeper.on_progress("worker-0", 5, {}, "checkpoint_000004")
    assert rec.calls == []  # nothing recorded for a refused report
    name = ck.commit(_folder(tmp_path, "a", "1"), keeper.storage, step=5)
    keeper.on_progress("worker-0", 5, {}, name)
    assert [c[0] for c in rec.calls] == ["progress", "step", "event"]


def test_a_long_resume_download_shows_how_far_it_got() -> None:
    """Issue 20: a download that takes a while says what, how much and how far."""
    import io

    from trainguard.storage.checkpoints import DownloadMeter

    now = [0.0]
    out = io.StringIO()
    shown = DownloadMeter("s3://b/job/checkpoint_000040", 4, 40_000_000, lambda: now[0], out)
    for _ in range(4):
        now[0] += 2.5
        shown.advance(10_000_000)
    shown.done()
    lines = out.getvalue().splitlines()
    assert lines[0] == (
        "trainguard: downloading checkpoint s3://b/job/checkpoint_000040 (4 files, 40.0 MB)"
    )
    assert lines[1] == "trainguard:   10.0 MB of 40.0 MB (25%), 4.0 MB/s"
    assert lines[2] == "trainguard:   30.0 MB of 40.0 MB (75%), 4.0 MB/s"  # every 5 s
    assert lines[-1] == "trainguard: checkpoint downloaded in 10.0 s"
    quick = io.StringIO()
    fast = DownloadMeter("s3://b/x", 1, 10, lambda: 0.0, quick)
    fast.advance(10)
    fast.done()
    assert quick.getvalue() == ""


def _linked(tmp_path: Path) -> Path:
    """A checkpoint folder whose optimizer state is reached through a linked folder."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "opt.bin").write_text("optimizer state")
    (elsewhere / "deep" / "rng.bin").write_text("rng state")
    folder = tmp_path / "linked"
    folder.mkdir()
    (folder / "model.bin").write_text("weights")
    (folder / "optim").symlink_to(elsewhere, target_is_directory=True)
    (folder / "config.json").symlink_to(elsewhere / "opt.bin")
    return folder


LINKED_FILES = ["config.json", "model.bin", "optim/deep/rng.bin", "optim/opt.bin"]


def test_a_corrupt_file_under_a_linked_folder_is_caught(tmp_path: Path) -> None:
    """Issue 37: files through a linked folder were copied but not in the manifest."""
    storage = tmp_path / "store"
    name = ck.commit(_linked(tmp_path), storage)
    manifest = ck.manifest_of(storage, name)
    assert manifest is not None and sorted(manifest["files"]) == LINKED_FILES
    assert (storage / name / "optim" / "deep" / "rng.bin").read_text() == "rng state"
    assert ck.verify(storage, name)
    (storage / name / "optim" / "deep" / "rng.bin").write_text("torn write")
    assert not ck.verify(storage, name) and ck.latest(storage) is None


def test_a_corrupt_file_under_a_linked_folder_is_caught_through_fsspec(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    url = f"memory://trainguard-test-{tmp_path.name}/linked"
    name = ck.commit(_linked(tmp_path), url)
    manifest = ck.manifest_of(url, name)
    assert manifest is not None and sorted(manifest["files"]) == LINKED_FILES
    assert ck.verify(url, name)
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/{name}/optim/opt.bin", b"torn write")
    assert not ck.verify(url, name) and ck.latest(url) is None


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: (d / "loop").symlink_to(d, target_is_directory=True), "loop links back"),
        (lambda d: (d / "gone").symlink_to(d / "nowhere"), "gone is a link to nothing"),
        (lambda d: os.mkfifo(d / "pipe"), "pipe is neither a file nor a folder"),
    ],
    ids=["loop", "dangling", "fifo"],
)
def test_a_link_that_cannot_be_followed_is_refused_in_one_line(
    tmp_path: Path, make: Any, says: str
) -> None:
    storage, folder = tmp_path / "store", _folder(tmp_path, "f", "1")
    make(folder / "sub")
    with pytest.raises(ValueError, match=says) as err:
        ck.commit(folder, storage)
    assert "\n" not in str(err.value)
    assert not storage.exists() or list(storage.iterdir()) == []  # nothing stored
