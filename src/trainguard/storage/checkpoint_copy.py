"""A checkpoint's files, and its copy into a local storage folder (issue 37). Standard
library only: the SDK commits checkpoints inside the training process.

- `listing`: every file of a checkpoint folder, through links to files and to folders.
  The manifest and the copy are both made from it, so a file reached through a linked
  folder is copied *and* verified (it used to be copied and not verified). A link that
  loops back to a folder that holds it, or leads nowhere, is refused with one line.
- `Incoming`: the hidden folder a copy is made in (`.incoming-XXXX`), with its lock file
  (`.incoming-XXXX.lock`) held by the writer until the copy is renamed into place or gone.
- `sweep`: removes the copies no live writer holds, as a replica killed mid-copy leaves
  them (three kills once left 130 MB). A copy is its writer's while the writer holds its
  lock (the kernel drops a dead process's lock; NFS locks hold across hosts). Where the
  lock is free or cannot be tried, the owner written in the lock file decides: a writer
  on this machine is alive while its pid runs with the same start time; one on another
  machine (or one unknown) while anything in its copy changed in the last `QUIET_S`
  (a folder mounted without working locks must not lose a live copy).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.storage.private import private_dir, tighten

PREFIX = ".incoming-"
LOCK = ".lock"
QUIET_S = 600.0
"""A copy of another machine's writer, or of an unknown one, that nothing was written to
for this long is left over (a copy writes its files continuously)."""


@dataclass(frozen=True)
class Listing:
    """The files of a checkpoint folder by their path inside it (with "/"), and its
    folders (empty ones too), as the copy recreates them."""

    files: dict[str, Path] = field(default_factory=dict)
    folders: tuple[str, ...] = ()


def listing(src: Path) -> Listing:
    """What `src` holds, links followed (see above); ValueError for what cannot be."""
    files: dict[str, Path] = {}
    folders: list[str] = []

    def walk(folder: Path, rel: str, above: frozenset[tuple[int, int]]) -> None:
        here = folder.stat()
        key = (here.st_dev, here.st_ino)
        if key in above:
            raise ValueError(
                f"checkpoint folder {src}: {rel.rstrip('/')} links back to a folder that "
                "holds it (a loop that would copy it forever)"
            )
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            name = f"{rel}{entry.name}"
            try:
                st = entry.stat()  # through a link
            except FileNotFoundError:
                raise ValueError(
                    f"checkpoint folder {src}: {name} is a link to nothing "
                    f"({os.readlink(entry.path)})"
                ) from None
            if stat.S_ISDIR(st.st_mode):
                folders.append(name)
                walk(Path(entry.path), f"{name}/", above | {key})
            elif stat.S_ISREG(st.st_mode):
                files[name] = Path(entry.path)
            else:
                raise ValueError(
                    f"checkpoint folder {src}: {name} is neither a file nor a folder "
                    "(a pipe, socket or device cannot be checkpointed)"
                )

    walk(src, "", frozenset())
    return Listing(files, tuple(folders))


def sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


class Incoming:
    """A hidden folder in `root` to copy a checkpoint into, locked until `close`."""

    def __init__(self, root: Path) -> None:
        while True:
            fd, lock = tempfile.mkstemp(dir=root, prefix=PREFIX, suffix=LOCK)
            with contextlib.suppress(OSError):  # no locks here: the owner decides
                fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)  # a sweep took it before it was locked: another name
        self._fd, self._lock = fd, lock
        self.path = Path(lock[: -len(LOCK)])
        try:
            os.write(fd, json.dumps(_me()).encode())
            self.path.mkdir(mode=0o700)  # as mkdtemp made it: a checkpoint is private
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._lock)
        os.close(self._fd)

    def __enter__(self) -> Incoming:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy(files: Listing, into: Path) -> None:
    """Contents and the owner's modes (the copy is private: `storage.private`); each
    file's time is the copy's (what `sweep` reads)."""
    for rel in files.folders:
        private_dir(into / rel)
    for rel, path in files.files.items():
        tighten(Path(shutil.copy(path, into / rel)))


def sweep(root: Path, now_s: float | None = None) -> list[str]:
    """Remove the copies in `root` that no live writer holds; returns their names."""
    try:
        names = {n for n in os.listdir(root) if n.startswith(PREFIX)}
    except FileNotFoundError:
        return []
    now_s = time.time() if now_s is None else now_s
    removed = []
    for stem in sorted({n.removesuffix(LOCK) for n in names}):
        folder, lock = root / stem, root / f"{stem}{LOCK}"
        if stem + LOCK not in names:  # a copy made before locks, or a lock gone meanwhile
            if _quiet(folder, now_s) and _remove(folder, None):
                removed.append(stem)
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue  # renamed into place and unlocked meanwhile
        try:
            if _left_over(fd, folder, now_s) and _remove(folder, lock):
                removed.append(stem)
        finally:
            os.close(fd)  # the lock `_left_over` took, if it did
    return removed


def _left_over(fd: int, folder: Path, now_s: float) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # its writer holds it: alive
    except OSError:
        pass  # no locks here: the owner decides
    try:
        owner = json.loads(os.read(fd, 4096) or b"null")
    except ValueError:
        owner = None
    if isinstance(owner, dict) and _here(owner):
        return not _runs(owner.get("pid"), owner.get("start"))
    return _quiet(folder, now_s)


def _remove(folder: Path, lock: Path | None) -> bool:
    """True if anything was there to remove (not a copy renamed into place meanwhile)."""
    there = os.path.lexists(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if lock is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)  # while locked: a writer racing for this name sees it gone
            there = True
    return there


def _me() -> dict[str, object]:
    return {"host": _host(), "pid": os.getpid(), "start": _start_ticks(os.getpid())}


def _host() -> str:
    """This machine: its name and its kernel's boot (namespace hosts share a kernel)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _start_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[19])  # starttime, the 22nd field


def _here(owner: dict[str, object]) -> bool:
    return owner.get("host") == _host()


def _runs(pid: object, start: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool):
        return True  # cannot tell: keep it
    ticks = _start_ticks(pid)
    return ticks is not None and (start is None or ticks == start)


def _quiet(folder: Path, now_s: float) -> bool:
    """Nothing in `folder` (files, folders, itself) changed for QUIET_S."""
    newest = 0.0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in ["", *dirnames, *filenames]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
    return newest > 0 and now_s - newest > QUIET_S
