"""Checkpoints committed atomically into the job's storage (R-CKPT-1). Standard library
only: the SDK commits and reads them inside the training process.

    <storage>/checkpoint_000007/...            the files the training code reported
    <storage>/checkpoint_000007/trainguard-manifest.json   every file's size and sha256
    <storage>/index.json                       what retention keeps (written before deletes)
    <storage>/bad.json                         checkpoints the training code could not load

A checkpoint is copied into a hidden temporary folder and renamed into place only once
its manifest is written, so a crash at any moment leaves either no checkpoint or a
complete one; one whose files do not match its manifest is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "trainguard-manifest.json"
_NAME = re.compile(r"^checkpoint_(\d{6,})$")


@dataclass(frozen=True)
class Entry:
    name: str
    index: int
    step: int | None
    metrics: dict[str, Any]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _write_json(path: Path, data: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def entries(storage: Path) -> list[Entry]:
    """The committed checkpoints (manifest present), oldest first."""
    out = []
    for d in storage.glob("checkpoint_*") if storage.is_dir() else ():
        m = _NAME.match(d.name)
        if not m or not (d / MANIFEST).is_file():
            continue
        try:
            manifest = json.loads((d / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        out.append(Entry(d.name, int(m[1]), manifest.get("step"), manifest.get("metrics", {})))
    return sorted(out, key=lambda e: e.index)


def commit(
    src: Path, storage: Path, *, step: int | None = None, metrics: dict[str, Any] | None = None
) -> Path:
    """Copy `src` (a folder) into storage as the next checkpoint, atomically."""
    if not src.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {src}")
    storage.mkdir(parents=True, exist_ok=True)
    started_s = time.time()
    tmp = Path(tempfile.mkdtemp(dir=storage, prefix=".incoming-"))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        files = {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        manifest = {
            "step": step,
            "metrics": metrics or {},
            "files": files,
            "at_s": time.time(),
            "commit_ms": (time.time() - started_s) * 1000,  # the cost of a checkpoint
        }
        _write_json(tmp / MANIFEST, manifest)
        while True:  # two writers may race for a number: the rename decides
            last = max((e.index for e in entries(storage)), default=0)
            final = storage / f"checkpoint_{last + 1:06d}"
            try:
                tmp.rename(final)
                return final
            except OSError:
                if not final.exists():
                    raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def commit_ms(path: Path) -> float | None:
    """How long committing this checkpoint took (copy and hashing), from its manifest."""
    try:
        value = json.loads((path / MANIFEST).read_text()).get("commit_ms")
    except (OSError, ValueError):
        return None
    return float(value) if isinstance(value, int | float) else None


def verify(path: Path) -> bool:
    """True if every file of the checkpoint matches its manifest."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        return all(
            (path / name).is_file()
            and (path / name).stat().st_size == meta["size"]
            and _sha256(path / name) == meta["sha256"]
            for name, meta in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False


def bad(storage: Path) -> set[str]:
    try:
        return set(json.loads((storage / "bad.json").read_text()))
    except (OSError, ValueError):
        return set()


def mark_bad(storage: Path, path: Path) -> None:
    """The training code could not load this checkpoint: never offer it again."""
    _write_json(storage / "bad.json", sorted(bad(storage) | {path.name}))


def latest(storage: Path) -> Path | None:
    """The newest complete, verified checkpoint not marked bad."""
    skip = bad(storage)
    for entry in reversed(entries(storage)):
        path = storage / entry.name
        if entry.name not in skip and verify(path):
            return path
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


def apply_retention(storage: Path, **policy: Any) -> list[str]:
    """Write the index of what is kept, then delete the rest; returns what was deleted."""
    found = entries(storage)
    kept = to_keep(found, **policy)
    _write_json(storage / "index.json", {"checkpoints": kept})
    gone = [e.name for e in found if e.name not in kept]
    for name in gone:
        shutil.rmtree(storage / name, ignore_errors=True)
    return gone
