"""In-memory snapshots (issue 16): every rank's training state in shared memory, each step,
so a restart redoes at most the step that was running. Standard library only: the SDK
writes and reads them inside the training process.

    <root>/step_000000000042/rank_0.snap     one file per rank and step
    <root>/step_000000000042/rank_1.snap

`root` is a folder in /dev/shm (memory, not disk) that the master makes for the job and
removes when it ends: a snapshot outlives the replica that wrote it, not the master. Each
file is a header line (step, rank, world size, attempt, format, size, CRC-32) and the
serialised state, written under a hidden name and renamed into place, so a reader sees a
whole file or none; the size and checksum catch the rest (a CRC, not a digest: it runs in
the training step, at 4 GB/s where SHA-256 does 1; the folder is the job user's alone, and
the durable copies carry SHA-256 as every checkpoint does). A step is usable when every
rank's file for it is there, verifies, and was written in the same attempt (a rank that
died mid-step leaves a file its peers never matched). Each rank keeps its last `KEEP`
steps and removes older ones.

The master copies every N-th complete step into the job's durable checkpoint storage
(`persist`), as an ordinary checkpoint whose files are these; `load` reads either.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"trainguard-snapshot 1\n"
KEEP = 3
"""Steps each rank keeps: a rank may be one step ahead of a peer that died mid-step."""
_STEP = re.compile(r"^step_(\d{12})$")
_RANK = re.compile(r"^rank_(\d+)\.snap$")
SHM = Path("/dev/shm")


def due(step: int, every: int) -> bool:
    """Whether a step's snapshots are copied to durable storage (every N-th step; 0: never)."""
    return every > 0 and step % every == 0


@dataclass(frozen=True)
class Header:
    step: int
    rank: int
    world: int
    attempt: int
    format: str  # how the state was serialised: "pickle", or "torch" (torch.save)
    size: int
    crc32: int


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:012d}"


def rank_file(rank: int) -> str:
    return f"rank_{rank}.snap"


OWNER = "master.pid"
"""In each job's folder: the pid of the master that made it (dead: the folder is garbage)."""


def make_root(job_id: str, fallback: Path) -> Path:
    """A fresh folder for the job's snapshots: in /dev/shm where there is one, else
    `fallback` (then they are on disk, which still outlives the replica). Folders that
    masters killed before they could remove them are removed first: memory, not disk."""
    base = SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else fallback
    sweep(base)
    root = base / f"trainguard-{job_id}"
    shutil.rmtree(root, ignore_errors=True)  # a killed master's: not this master's to offer
    root.mkdir(parents=True, mode=0o700)
    (root / OWNER).write_text(str(os.getpid()))
    return root


def sweep(base: Path) -> None:
    """Remove the snapshot folders in `base` whose master is gone."""
    with contextlib.suppress(OSError):
        for folder in base.glob("trainguard-*"):
            try:
                pid = int((folder / OWNER).read_text())
                os.kill(pid, 0)
            except ProcessLookupError:
                shutil.rmtree(folder, ignore_errors=True)
            except (OSError, ValueError):
                continue  # not ours to judge (another user's, or being made right now)


def write(
    root: Path,
    rank: int,
    world: int,
    attempt: int,
    step: int,
    payload: bytes | memoryview,
    form: str = "pickle",
) -> Path:
    """Store one rank's state for `step`; drop this rank's steps older than the last KEEP."""
    folder = step_dir(root, step)
    folder.mkdir(parents=True, exist_ok=True)
    header = Header(step, rank, world, attempt, form, len(payload), zlib.crc32(payload))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".rank_{rank}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(MAGIC)
        fh.write(json.dumps(header.__dict__).encode() + b"\n")
        fh.write(payload)
    target = folder / rank_file(rank)
    os.replace(tmp, target)
    for old in steps(root)[KEEP:]:
        with contextlib.suppress(OSError):
            (step_dir(root, old) / rank_file(rank)).unlink()
        with contextlib.suppress(OSError):
            step_dir(root, old).rmdir()  # the last rank out removes the folder
    return target


def read(path: Path) -> tuple[Header, bytes] | None:
    """The header and state in one snapshot file; None if it is missing, torn or altered."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if not data.startswith(MAGIC):
        return None
    line, sep, payload = data[len(MAGIC) :].partition(b"\n")
    try:
        header = Header(**json.loads(line))
    except (ValueError, TypeError):
        return None
    if not sep or len(payload) != header.size or zlib.crc32(payload) != header.crc32:
        return None
    return header, payload


def steps(root: Path) -> list[int]:
    """The steps some rank holds, newest first."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted((int(m[1]) for n in names if (m := _STEP.match(n))), reverse=True)


def complete(folder: Path, world: int) -> int | None:
    """The step `folder` holds for every one of `world` ranks (verified, one attempt)."""
    headers = []
    for rank in range(world):
        found = read(folder / rank_file(rank))
        if found is None:
            return None
        headers.append(found[0])
    if {(h.step, h.world, h.attempt) for h in headers} != {
        (headers[0].step, world, headers[0].attempt)
    }:
        return None
    if [h.rank for h in headers] != list(range(world)):
        return None
    return headers[0].step


def newest_complete(root: Path, world: int) -> int | None:
    """The newest step that every rank holds, written in one attempt; None if none."""
    for step in steps(root):
        if complete(step_dir(root, step), world) == step:
            return step
    return None


def persist(root: Path, step: int, world: int, stage: Path) -> Path | None:
    """Hard-link a complete step into `stage` (instant, and safe from the ranks' clean-up),
    to be committed from there; None if the step is no longer complete."""
    folder = step_dir(root, step)
    stage.mkdir(parents=True, exist_ok=True)
    try:
        for rank in range(world):
            os.link(folder / rank_file(rank), stage / rank_file(rank))
    except OSError:
        shutil.rmtree(stage, ignore_errors=True)
        return None
    if complete(stage, world) != step:
        shutil.rmtree(stage, ignore_errors=True)
        return None
    return stage


def load(folder: Path, rank: int) -> tuple[Header, bytes] | None:
    """This rank's header and state from a snapshot folder (in memory or a durable copy)."""
    found = read(folder / rank_file(rank))
    if found is None or found[0].rank != rank:
        return None
    return found


def is_snapshot(folder: Path) -> bool:
    """A folder (a durable checkpoint) made of snapshot files."""
    return (folder / rank_file(0)).is_file()
