"""Folders 0700 and files 0600, whatever the umask (issue 37): everything trainguard writes
under its home (the store, job folders, replica logs, stacks, snapshots, checkpoints) is
its user's alone. Job specs hold environment values (secrets among them), logs hold what
the job printed. Standard library only: node agents and replicas' helpers import it."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def private_dir(path: Path) -> Path:
    """Make `path`, and each missing folder above it, a folder of this user's only (a plain
    `mkdir(parents=True)` makes the parents by the umask). A folder that exists keeps its
    mode: it may be one the user chose, or a system one (`/dev`, above a log at
    `/dev/null`); the store tightens its own with `tighten`."""
    if not path.is_dir():
        if path.parent != path and not path.parent.exists():
            private_dir(path.parent)
        with contextlib.suppress(FileExistsError):  # made meanwhile (another rank's)
            path.mkdir(mode=PRIVATE_DIR)  # the umask only takes bits away: 0700 stays
    return path


def private_file(path: Path) -> Path:
    """Make `path` an (empty) file of this user's only, unless it exists; tighten it if it
    is a regular file that is not (never a device: a log may be `/dev/null`)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, PRIVATE_FILE))
    return tighten(path, PRIVATE_FILE)


def append_private(path: Path, buffering: int = -1) -> BinaryIO:
    """`path` opened to append bytes, made private (with its missing folders) first."""
    private_dir(path.parent)
    return open(private_file(path), "ab", buffering=buffering)


def replace_private(path: Path, data: bytes) -> None:
    """`path` holds `data`, whole or not at all for a reader at any moment (a file of this
    user's only, written beside it, synced, then renamed over it)."""
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def tighten(path: Path, mode: int = PRIVATE_DIR) -> Path:
    """Take group and others' access away from a regular file or folder this user owns (a
    store made before, a file copied with its modes); the user's own bits within `mode`
    are kept. Anything else (a device, a pipe) is left as it is."""
    found = path.stat()
    kind = stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode)
    if kind and found.st_mode & 0o077 and found.st_uid == os.geteuid():
        path.chmod(stat.S_IMODE(found.st_mode) & mode)
    return path
