"""Checkpoints committed atomically into the job's storage (R-CKPT-1). Standard library
only: the SDK commits and reads them inside the training process.

    <storage>/checkpoint_000007/...            the files the training code reported
    <storage>/checkpoint_000007/trainguard-manifest.json   every file's size and sha256
    <storage>/index.json                       what retention keeps (written before deletes)
    <storage>/bad.json                         checkpoints the training code could not load

A checkpoint is complete when its manifest is there and every file matches it. In a local
or shared folder it is copied under a hidden name and renamed into place once complete
(what a killed writer leaves there is swept by the next commit and by retention:
`checkpoint_copy`); in an fsspec URL (s3://, gs://, memory://; needs `pip install
fsspec`), where renames are copies, its files are uploaded first and the manifest last.
Either way a crash at any moment leaves no checkpoint that `latest()` would offer
half-written. Files reached through links (to files or folders) are copied and verified
alike.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.storage import checkpoint_copy
from trainguard.storage.checkpoint_copy import Incoming, Listing
from trainguard.storage.private import private_dir, replace_private

MANIFEST = "trainguard-manifest.json"
STORAGE_CHECK = ".trainguard-storage-check"
"""The marker file the master writes at a job's start (`write_marker`): a host that reads
its token back sees the job's storage (`backends.storage_check`)."""
_NAME = re.compile(r"^checkpoint_(\d{6,})$")
Storage = Path | str  # a folder, or an fsspec URL


@dataclass(frozen=True)
class Entry:
    name: str
    index: int
    step: int | None
    metrics: dict[str, Any]


def is_url(storage: Storage) -> bool:
    return "://" in str(storage)


class _Local:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def names(self) -> list[str]:
        return [p.name for p in self.root.iterdir()] if self.root.is_dir() else []

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def write(self, rel: str, data: bytes) -> None:
        replace_private(self.root / rel, data)

    def files(self, rel: str) -> dict[str, int]:
        base = self.root / rel
        return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*") if p.is_file()}

    def upload(self, files: Listing, name: str, manifest: bytes) -> bool:
        """Copy under a hidden name (locked: `checkpoint_copy`), add the manifest, rename
        into place."""
        private_dir(self.root)
        with Incoming(self.root) as tmp:
            checkpoint_copy.copy(files, tmp.path)
            (tmp.path / MANIFEST).write_bytes(manifest)
            try:
                tmp.path.rename(self.root / name)
                return True
            except OSError:
                if (self.root / name).exists():
                    return False  # another writer took this number
                raise

    def sweep(self) -> list[str]:
        return checkpoint_copy.sweep(self.root)

    def local_copy(self, name: str) -> Path:
        return self.root / name

    def remove(self, name: str) -> None:
        shutil.rmtree(self.root / name, ignore_errors=True)

    def path(self, name: str) -> str:
        return str(self.root / name)


class _Remote:
    def __init__(self, url: str) -> None:
        import fsspec  # type: ignore[import-untyped]

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def names(self) -> list[str]:
        if not self.fs.exists(self.root):
            return []
        return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]

    def read(self, rel: str) -> bytes:
        return bytes(self.fs.cat_file(self._p(rel)))

    def write(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self._p(rel), data)

    def files(self, rel: str) -> dict[str, int]:
        base = self._p(rel)
        found = self.fs.find(base, detail=True)
        return {str(k)[len(base) + 1 :]: int(v["size"]) for k, v in found.items()}

    def upload(self, files: Listing, name: str, manifest: bytes) -> bool:
        """Files first, the manifest last: until it lands the checkpoint does not exist."""
        if name in self.names():
            return False
        for rel, path in files.files.items():
            self.fs.pipe_file(self._p(f"{name}/{rel}"), path.read_bytes())
        self.write(f"{name}/{MANIFEST}", manifest)
        return True

    def sweep(self) -> list[str]:
        """Nothing: an object store has no lock to tell a live upload from a dead one (an
        upload's files without their manifest are not a checkpoint, and are skipped)."""
        return []

    def local_copy(self, name: str) -> Path:
        """The checkpoint downloaded into a local cache folder (training code reads files)."""
        key = hashlib.sha1(f"{self.url}/{name}".encode()).hexdigest()[:12]
        target = Path(tempfile.gettempdir()) / f"trainguard-ckpt-{key}" / name
        if not (target / MANIFEST).is_file():
            files = self.files(name)
            shown = DownloadMeter(self.path(name), len(files), sum(files.values()))
            for rel, size in sorted(files.items(), key=lambda kv: kv[0] == MANIFEST):
                out = target / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(self.read(f"{name}/{rel}"))  # the manifest last: complete
                shown.advance(size)
            shown.done()
        return target

    def remove(self, name: str) -> None:
        if self.fs.exists(self._p(name)):
            self.fs.rm(self._p(name), recursive=True)

    def path(self, name: str) -> str:
        return f"{self.url}/{name}"


class DownloadMeter:
    """A resume's download, told on stderr (the replica's log) when it takes a while: what,
    how much, and every EVERY_S how far; a quick one says nothing."""

    AFTER_S = 2.0
    EVERY_S = 5.0

    def __init__(
        self, source: str, files: int, total: int, clock: Any = time.monotonic, out: Any = None
    ) -> None:
        self.source, self.files, self.total = source, files, total
        self.clock, self.out = clock, out
        self.t0 = self.shown_s = clock()
        self.got = 0
        self.told = False

    def _say(self, text: str) -> None:
        import sys

        print(f"trainguard: {text}", file=self.out or sys.stderr, flush=True)

    def advance(self, size: int) -> None:
        self.got += size
        now = self.clock()
        if now - self.t0 < self.AFTER_S or (self.told and now - self.shown_s < self.EVERY_S):
            return
        if not self.told:
            self.told = True
            self._say(
                f"downloading checkpoint {self.source} ({self.files} files, {_mb(self.total)})"
            )
        self.shown_s = now
        pct = 100 * self.got / self.total if self.total else 100.0
        rate = self.got / max(now - self.t0, 1e-9)
        self._say(f"  {_mb(self.got)} of {_mb(self.total)} ({pct:.0f}%), {_mb(rate)}/s")

    def done(self) -> None:
        if self.told:
            self._say(f"checkpoint downloaded in {self.clock() - self.t0:.1f} s")


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def write_marker(storage: Storage, token: str) -> None:
    """The marker each host of the job reads back (backends.storage_check)."""
    _place(storage).write(STORAGE_CHECK, token.encode())


def _place(storage: Storage) -> _Local | _Remote:
    return _Remote(str(storage)) if is_url(storage) else _Local(Path(storage))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest(place: _Local | _Remote, name: str) -> dict[str, Any] | None:
    try:
        data = json.loads(place.read(f"{name}/{MANIFEST}"))
    except (OSError, ValueError, KeyError):
        return None
    return data if isinstance(data, dict) else None


def entries(storage: Storage) -> list[Entry]:
    """The committed checkpoints (manifest present), oldest first."""
    place = _place(storage)
    out = []
    for name in place.names():
        m = _NAME.match(name)
        manifest = _manifest(place, name) if m else None
        if m and manifest is not None:
            out.append(Entry(name, int(m[1]), manifest.get("step"), manifest.get("metrics", {})))
    return sorted(out, key=lambda e: e.index)


def commit(
    src: Path, storage: Storage, *, step: int | None = None, metrics: dict[str, Any] | None = None
) -> str:
    """Store `src` (a folder) as the next checkpoint; returns its name."""
    if not src.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {src}")
    started_s = time.time()
    found = checkpoint_copy.listing(src)
    files = {
        rel: {"size": path.stat().st_size, "sha256": checkpoint_copy.sha256(path)}
        for rel, path in found.files.items()
    }
    if not files:
        raise ValueError(f"checkpoint folder {src} holds no files: nothing to resume from")
    place = _place(storage)
    place.sweep()  # what writers killed mid-copy left
    while True:  # two writers may race for a number: the one that lands first keeps it
        # past any checkpoint folder, complete or not: an upload killed before its
        # manifest leaves one that would take this number forever
        last = max((int(m[1]) for n in place.names() if (m := _NAME.match(n))), default=0)
        name = f"checkpoint_{last + 1:06d}"
        manifest = {
            "step": step,
            "metrics": metrics or {},
            "files": files,
            "at_s": time.time(),
            "commit_ms": (time.time() - started_s) * 1000,  # the cost of a checkpoint
        }
        if place.upload(found, name, json.dumps(manifest, indent=1).encode()):
            return name


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder (as `latest()` returns it); None if unreadable."""
    return _manifest(_Local(folder.parent), folder.name)


def manifest_of(storage: Storage, name: str) -> dict[str, Any] | None:
    """The manifest of a committed checkpoint; None if there is no such checkpoint."""
    return _manifest(_place(storage), name) if _NAME.match(name) else None


def commit_ms(manifest: dict[str, Any]) -> float | None:
    """How long preparing a checkpoint took (hashing), from its manifest."""
    value = manifest.get("commit_ms")
    return float(value) if isinstance(value, int | float) else None


def verify(storage: Storage, name: str) -> bool:
    """True if every file of the checkpoint matches its manifest."""
    place = _place(storage)
    manifest = _manifest(place, name)
    try:
        files = manifest["files"] if manifest else None
        return (
            isinstance(files, dict)
            and bool(files)
            and all(
                _sha256(place.read(f"{name}/{rel}")) == meta["sha256"]
                for rel, meta in files.items()
            )
        )
    except (OSError, KeyError, TypeError, FileNotFoundError):
        return False


def bad(storage: Storage) -> set[str]:
    try:
        return set(json.loads(_place(storage).read("bad.json")))
    except (OSError, ValueError, FileNotFoundError):
        return set()


def mark_bad(storage: Storage, name: str) -> None:
    """The training code could not load this checkpoint: never offer it again."""
    names = sorted(bad(storage) | {name})
    _place(storage).write("bad.json", json.dumps(names).encode())


def latest(storage: Storage) -> Path | None:
    """A local folder with the newest complete, verified checkpoint not marked bad."""
    skip = bad(storage)
    for entry in reversed(entries(storage)):
        if entry.name not in skip and verify(storage, entry.name):
            return _place(storage).local_copy(entry.name)
    return None


def to_keep(
    found: Sequence[Entry],
    keep_last: int,
    keep_best: int = 0,
    score_attribute: str | None = None,
    score_order: str = "max",
) -> list[str]:
    """Which checkpoints retention keeps: the latest N and the best K; never the newest."""
    keep = {e.name for e in found[-max(1, keep_last) :]}
    if keep_best and score_attribute:
        scored = [e for e in found if isinstance(e.metrics.get(score_attribute), int | float)]
        scored.sort(key=lambda e: float(e.metrics[score_attribute]), reverse=score_order == "max")
        keep |= {e.name for e in scored[:keep_best]}
    return [e.name for e in found if e.name in keep]


def apply_retention(storage: Storage, **policy: Any) -> list[str]:
    """Write the index of what is kept, then delete the rest and the copies that killed
    writers left; returns what was deleted."""
    found = entries(storage)
    kept = to_keep(found, **policy)
    place = _place(storage)
    place.write("index.json", json.dumps({"checkpoints": kept}, indent=1).encode())
    gone = [e.name for e in found if e.name not in kept]
    for name in gone:
        place.remove(name)
    return gone + place.sweep()
