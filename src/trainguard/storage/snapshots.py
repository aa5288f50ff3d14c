"""In-memory snapshots (issue 16): every rank's training state in shared memory, each step,
so a restart redoes at most the step that was running. Standard library only: the SDK
writes and reads them inside the training process.

    <root>/step_000000000042/rank_0.snap     one file per rank and step
    <root>/step_000000000042/rank_1.snap

`root` is a folder in /dev/shm (memory, not disk) that the master makes for the job and
removes when it ends: a snapshot outlives the replica that wrote it, not the master. Each
file is a header block (magic; step, rank, world size, attempt, format, size, CRC-32) and
the state. The header is written last, after the CRC of what was copied, so a reader sees
a whole snapshot or none, and the size and checksum catch the rest: a file rewritten under
a reader, a torn one (a CRC, not a digest: 4 GB/s where SHA-256 does 1, and the folder is
the job user's alone; the durable copies carry SHA-256 as every checkpoint does). A step
is usable when every rank's file for it is there, verifies, and was written in the same
attempt (a rank that died mid-step leaves a file its peers never matched). Each rank keeps
its last `KEEP` steps, and rewrites the oldest in place for the next (`Writer`).

The master copies every N-th complete step into the job's durable checkpoint storage
(`persist`), as an ordinary checkpoint whose files are these; `load` reads either.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import shutil
import tempfile
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trainguard.storage.private import private_dir, private_file

MAGIC = b"trainguard-snapshot 2\n"
HEADER_BYTES = 4096
"""The magic and the header line, padded: the payload starts on a page of its own."""
ALIGN = 64
"""Each part of the payload starts on a multiple of this (a cache line; any dtype)."""
INLINE_COMMIT = 1 << 20
"""Below this many bytes the CRC takes less than starting a thread to compute it."""
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
    format: str  # how the state was serialised: "pickle", or "tensors" (the SDK's)
    size: int  # of the payload, after the header block
    crc32: int
    skeleton: int = 0  # bytes of pickle before the tensors' data ("tensors")


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
    private_dir(root)
    private_file(root / OWNER).write_text(str(os.getpid()))
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


Copy = Callable[[memoryview], None]
"""Fills the view it is given (exactly its part's bytes) with that part of the state."""


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass
class _Slot:
    path: Path
    fd: int
    mm: mmap.mmap
    reusable: bool  # False once the master may hold a hard link to it (a step it copies)

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Writer:
    """One rank's snapshot files, written step after step into memory that is reused.

    A new file costs a page fault per 4 KiB on its first write; rewriting one of this
    rank's last KEEP files in place costs the copy alone. The file is marked
    invalid first, renamed to its new step, filled, and committed by a thread that
    computes its CRC and writes the header last, while training goes on: a rank killed
    before the commit leaves a step its peers cannot use, so the step before is offered.
    A file the master may have hard-linked (a step it copies to durable storage) is
    never rewritten.
    """

    def __init__(self, root: Path, rank: int) -> None:
        self.root, self.rank = root, rank
        self._slots: dict[int, _Slot] = {}  # step -> file, oldest first
        self._pending: threading.Thread | None = None

    def write(
        self,
        world: int,
        attempt: int,
        step: int,
        parts: Sequence[tuple[int, Copy]],
        form: str = "pickle",
        skeleton: int = 0,
        reusable: bool = True,
    ) -> Path:
        """Store `parts` (sizes and how to fill them) as this rank's state for `step`; the
        header is committed in the background (`wait` for it)."""
        self.wait()
        offsets, size = [], 0
        for n, _ in parts:
            size = _aligned(size)
            offsets.append(size)
            size += n
        slot = self._slot_for(step, HEADER_BYTES + size, reusable)
        view = memoryview(slot.mm)
        for (n, fill), off in zip(parts, offsets, strict=True):
            if n:
                fill(view[HEADER_BYTES + off : HEADER_BYTES + off + n])
        header = Header(step, self.rank, world, attempt, form, size, 0, skeleton)
        if size < INLINE_COMMIT:
            _commit(view, header)
        else:
            self._pending = threading.Thread(
                target=_commit, args=(view, header), name="trainguard-snapshot", daemon=False
            )
            self._pending.start()
        self._drop_old()
        return slot.path

    def wait(self) -> None:
        """Until the last step written is committed (or found torn by its reader)."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def close(self) -> None:
        self.wait()
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()

    def _slot_for(self, step: int, nbytes: int, reusable: bool) -> _Slot:
        target = step_dir(self.root, step) / rank_file(self.rank)
        private_dir(target.parent)
        old = self._slots.pop(step, None)
        if old is None and len(self._slots) >= KEEP:
            old = self._slots.pop(next(iter(self._slots)))
        if old is not None and old.reusable and _links(old.fd) == 1:
            old.mm[: len(MAGIC)] = bytes(len(MAGIC))  # no reader takes it from here on
            try:
                if old.path != target:
                    os.replace(old.path, target)
                    _rmdir(old.path.parent)
                if old.mm.size() < nbytes:  # the state grew
                    old.mm.close()
                    os.ftruncate(old.fd, nbytes)
                    old.mm = mmap.mmap(old.fd, nbytes)
                self._slots[step] = _Slot(target, old.fd, old.mm, reusable)
                return self._slots[step]
            except (OSError, BufferError):  # its folder went, or a view of it is alive
                pass
        if old is not None:
            old.close()
            if old.path != target:
                _unlink(old.path)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".rank_{self.rank}.")
        try:
            os.ftruncate(fd, nbytes)
            mm = mmap.mmap(fd, nbytes)
            os.replace(tmp, target)  # a new inode: a hard link to the old name keeps the old
        except BaseException:
            os.close(fd)
            _unlink(Path(tmp))
            raise
        self._slots[step] = _Slot(target, fd, mm, reusable)
        return self._slots[step]

    def _drop_old(self) -> None:
        """Files this rank left beyond its last KEEP steps (an earlier process's too)."""
        mine = {s.path for s in self._slots.values()}
        for old in steps(self.root)[KEEP:]:
            path = step_dir(self.root, old) / rank_file(self.rank)
            if path not in mine:
                _unlink(path)
                _rmdir(path.parent)  # the last rank out removes the folder


def _commit(view: memoryview, header: Header) -> None:
    """The CRC of what was copied, then the header, then the magic that makes it valid."""
    payload = view[HEADER_BYTES : HEADER_BYTES + header.size]
    done = replace(header, crc32=zlib.crc32(payload))
    line = json.dumps(done.__dict__).encode() + b"\n"
    block = line.ljust(HEADER_BYTES - len(MAGIC), b" ")
    view[len(MAGIC) : HEADER_BYTES] = block
    view[: len(MAGIC)] = MAGIC


def _links(fd: int) -> int:
    try:
        return os.fstat(fd).st_nlink
    except OSError:
        return 0


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def write(
    root: Path,
    rank: int,
    world: int,
    attempt: int,
    step: int,
    payload: bytes | memoryview,
    form: str = "pickle",
) -> Path:
    """Store one rank's serialised state for `step`, committed when this returns."""
    writer = Writer(root, rank)

    def fill(view: memoryview) -> None:
        view[:] = payload

    try:
        return writer.write(world, attempt, step, [(len(payload), fill)], form, len(payload))
    finally:
        writer.close()


def read(path: Path) -> tuple[Header, bytearray] | None:
    """The header and payload of one snapshot file; None if missing, torn or altered."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER_BYTES)
            if len(head) != HEADER_BYTES or not head.startswith(MAGIC):
                return None
            header = Header(**json.loads(head[len(MAGIC) :].partition(b"\n")[0]))
            payload = bytearray(header.size)
            got = fh.readinto(payload)
    except (OSError, ValueError, TypeError, OverflowError, MemoryError):
        return None
    if got != header.size or zlib.crc32(payload) != header.crc32:
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
    private_dir(stage)
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


def load(folder: Path, rank: int) -> tuple[Header, bytearray] | None:
    """This rank's header and state from a snapshot folder (in memory or a durable copy)."""
    found = read(folder / rank_file(rank))
    if found is None or found[0].rank != rank:
        return None
    return found
