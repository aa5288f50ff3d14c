"""The last bytes of a file a user names, read with a bound whatever the file is.

`seek` to the end and read from there is bounded only for a regular file: `/dev/zero`
seeks to 0 and never ends, a FIFO cannot seek, `/proc` files say they are empty. So a
device is refused, a regular file is read from `max_bytes` before its end, and anything
else (a pipe, a FIFO) is streamed keeping only its last `max_bytes`, up to a cap.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

STREAM_CAP_BYTES = 256 * 1024 * 1024
"""A stream (or a file that grows while it is read) with no end after this much is
refused: the tail of a log is read in well under a second."""

_CHUNK = 64 * 1024


def read_tail(path: Path, max_bytes: int, cap: int = STREAM_CAP_BYTES) -> bytes:
    """At most the last `max_bytes` of `path`; OSError (its strerror says why) if the file
    cannot be read or is not a log: a device, a folder, a stream longer than `cap`."""
    _refuse_devices(os.stat(path).st_mode)  # before opening: opening a device may act
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # a FIFO: waits for its writer, as `cat`
    try:
        mode = os.fstat(fd).st_mode
        _refuse_devices(mode)  # it may have changed since the stat
        if stat.S_ISDIR(mode):
            raise OSError(errno.EISDIR, "a folder, not a log file")
        if stat.S_ISREG(mode):
            os.lseek(fd, max(0, os.fstat(fd).st_size - max_bytes), os.SEEK_SET)
        return _last_bytes(fd, max_bytes, cap)
    finally:
        os.close(fd)


def _refuse_devices(mode: int) -> None:
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise OSError(errno.EINVAL, "a device, not a log file")


def _last_bytes(fd: int, keep: int, cap: int) -> bytes:
    tail = bytearray()
    total = 0
    while chunk := os.read(fd, _CHUNK):
        total += len(chunk)
        if total > cap + keep:
            raise OSError(errno.EFBIG, f"no end after {cap // 2**20} MiB: give the log file itself")
        tail += chunk
        if len(tail) > keep:
            del tail[: len(tail) - keep]
    return bytes(tail)
