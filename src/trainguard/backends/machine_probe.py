"""Reading the machine at a failure (R-EVID-1): the kernel log since the run began, the
free space and mount state of the job's paths, the GPUs' health, each with a time limit.

Nothing here may block the master: /dev/kmsg is read non-blocking and bounded, `statvfs`
runs in a daemon thread that is abandoned after its limit (a hung NFS mount must not hold
the failure, nor the master's exit), nvidia-smi runs under a timeout. A source that cannot
be read (no kmsg access in a container, no GPU, a mount that does not answer) becomes an
`absent` reading; the pure parsers (`classify.machine_parse`) say what the rest means.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import TypeVar

from trainguard.classify.machine_parse import (
    disk_reading,
    gpu_readings,
    kernel_readings,
    nvidia_smi_failed,
    tail_storage_readings,
)
from trainguard.classify.readings import Finding, MachineReading, Source

KMSG = Path("/dev/kmsg")
KMSG_MAX_RECORDS = 50_000
"""Records read at most (the kernel's ring buffer holds a few thousand: 128 KiB to a few
MiB of text)."""
KMSG_READ_S = 1.0
STATVFS_S = 2.0
NVIDIA_SMI_S = 10.0
_SLACK_US = 1_000_000  # the kernel's clock and ours are read apart: a second's grace

T = TypeVar("T")


def monotonic_us() -> int:
    """Now on the clock /dev/kmsg stamps its records with (microseconds since boot)."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)


def read_kmsg(path: Path = KMSG, max_records: int = KMSG_MAX_RECORDS) -> list[str] | str:
    """The kernel log's records now in its ring buffer, oldest first; or why they cannot
    be read. Non-blocking: it stops at the end of the buffer, at `max_records`, or after
    KMSG_READ_S."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return f"cannot open ({exc.strerror or exc})"
    records: list[str] = []
    deadline = time.monotonic() + KMSG_READ_S
    try:
        while len(records) < max_records and time.monotonic() < deadline:
            try:
                data = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten while we read: go on with the next
                if not records:
                    return f"cannot read ({exc.strerror or exc})"
                break
            if not data:
                break
            records.append(data.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return records


def kernel_probe(
    pids: Collection[int], since_us: int, cgroup: str | None = None, path: Path = KMSG
) -> list[MachineReading]:
    """The kernel log's lines about `pids` (or the cgroup `cgroup`) since `since_us`."""
    records = read_kmsg(path)
    if isinstance(records, str):
        return [MachineReading(Source.KMSG, f"{path}: {records}", "absent", False, Finding.ABSENT)]
    found = kernel_readings(records, since_us - _SLACK_US, pids, cgroup)
    if found:
        return found
    who = ", ".join(str(p) for p in sorted(pids)) or "?"
    return [
        MachineReading(
            Source.KMSG,
            f"{path}: no line about pid {who} since it started",
            "no OOM kill, crash or Xid logged for it",
            True,
        )
    ]


def disk_probe(path: str) -> MachineReading:
    st = os.statvfs(path)
    read_only = bool(st.f_flag & os.ST_RDONLY)
    return disk_reading(path, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize, read_only)


def gpu_probe(timeout_s: float = NVIDIA_SMI_S) -> list[MachineReading]:
    """The GPUs' health from `nvidia-smi -q -x`; absent where there is no nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [
            MachineReading(
                Source.GPU, "no nvidia-smi on this machine", "absent", False, Finding.ABSENT
            )
        ]
    try:
        res = subprocess.run(
            [smi, "-q", "-x"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        value = f"nvidia-smi did not answer in {timeout_s:g} s"
        return [MachineReading(Source.GPU, value, "absent (a hung driver?)", False, Finding.ABSENT)]
    except OSError as exc:
        return [MachineReading(Source.GPU, f"nvidia-smi: {exc}", "absent", False, Finding.ABSENT)]
    if res.returncode != 0:
        return [nvidia_smi_failed(res.stdout + res.stderr, res.returncode)]
    return gpu_readings(res.stdout)


async def bounded(call: Callable[[], T], timeout_s: float) -> T | None:
    """`call()` in a daemon thread, or None after `timeout_s` (the thread is abandoned:
    a call stuck in the kernel cannot be interrupted, and must not hold the exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            value: T | None = call()
            exc: BaseException | None = None
        except BaseException as e:  # handed to the waiting coroutine
            value, exc = None, e
        # an abandoned probe may outlive its loop (the master ended meanwhile): drop it
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, done, value, exc)

    threading.Thread(target=run, name="trainguard-probe", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(done), timeout_s)
    except TimeoutError:
        return None


def _settle(fut: asyncio.Future[T], value: T | None, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)  # type: ignore[arg-type]


async def _disk(path: str) -> MachineReading:
    try:
        found = await bounded(lambda: disk_probe(path), STATVFS_S)
    except OSError as exc:
        return MachineReading(
            Source.DISK, f"{path}: {exc.strerror or exc}", "absent", False, Finding.ABSENT, path
        )
    if found is None:
        value = f"{path}: statvfs did not answer in {STATVFS_S:g} s"
        return MachineReading(
            Source.DISK, value, "absent (a hung mount?)", False, Finding.ABSENT, path
        )
    return found


async def probe_exit(
    *,
    pids: Collection[int],
    since_us: int,
    paths: Iterable[str],
    tail: Iterable[str] = (),
    cgroup: str | None = None,
    extra: Iterable[MachineReading] = (),
    kmsg: Path = KMSG,
    gpus: bool = True,
) -> tuple[MachineReading, ...]:
    """Everything the machine says about a failed run, each probe under its limit, all at
    once: `extra` (what the caller read itself: its cgroup's counters), the kernel log,
    each path, the GPUs, and the storage errors in its last lines."""
    kernel = bounded(lambda: kernel_probe(pids, since_us, cgroup, kmsg), 2 * KMSG_READ_S)
    disks = asyncio.gather(*(_disk(p) for p in dict.fromkeys(paths)))
    gpu = bounded(gpu_probe, NVIDIA_SMI_S + 1) if gpus else _nothing()
    got_kernel, got_disks, got_gpu = await asyncio.gather(kernel, disks, gpu)
    if got_kernel is None:
        got_kernel = [
            MachineReading(Source.KMSG, f"{kmsg}: no answer", "absent", False, Finding.ABSENT)
        ]
    if got_gpu is None:
        got_gpu = [
            MachineReading(Source.GPU, "nvidia-smi: no answer", "absent", False, Finding.ABSENT)
        ]
    return (*extra, *got_kernel, *got_disks, *got_gpu, *tail_storage_readings(tail))


async def _nothing() -> list[MachineReading]:
    return []
