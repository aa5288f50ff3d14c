"""One run of one local replica: its process, its output, and what tracks every process it
starts (`tracking`); with the asyncio protocols that feed it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import TextIO

from trainguard.backends.interface import Launch, ReplicaExited
from trainguard.backends.local.oom import oom_kill_count
from trainguard.backends.local.tracking import RunProcesses
from trainguard.backends.machine_probe import (
    KMSG_READ_S,
    NVIDIA_SMI_S,
    STATVFS_S,
    monotonic_us,
)
from trainguard.backends.output import RunOutput
from trainguard.classify.classes import ExitEvidence

OnOutput = Callable[["Run", bool, tuple[str, ...]], None]
_TRACEBACK = "Traceback (most recent call last):"


class Run:
    """One run of one replica: its process and its output."""

    def __init__(
        self,
        launch: Launch,
        tee: TextIO | None,
        on_output: OnOutput,
        processes: RunProcesses,
    ) -> None:
        self.launch = launch
        self.output = RunOutput(
            launch.replica,
            launch.log_path,
            tee,
            partial(on_output, self),
        )
        self.processes = processes
        self.pid = 0
        self.transport: asyncio.BaseTransport | None = None
        self.returncode: int | None = None
        self.forked = False  # by the preload zygote: not our child, its exit comes by message
        self.stop_requested = False
        self.oom_before = oom_kill_count()
        self.started_us = monotonic_us()  # on the kernel log's clock: its lines since then
        self.notes: list[str] = []  # what trainguard knows of its end, added to its log tail
        self.zygote_died: str | None = None  # how the zygote that forked it died
        self.eof = asyncio.Event()
        self.exited = asyncio.Event()
        self.done = asyncio.Event()

    def printed_traceback(self) -> bool:
        return any(line.startswith(_TRACEBACK) for line in self.output.tail.lines())

    def oom_kills(self) -> int:
        """New OOM kills while it ran: in our cgroup, or counted by its own alone."""
        return max(0, oom_kill_count() - self.oom_before) + self.processes.oom_kills()

    def exit_with(self, code: int, note: str | None = None) -> None:
        """Its exit, learnt from someone else than its parent (the zygote's message, or
        the zygote's death)."""
        if self.exited.is_set():
            return
        if note is not None:
            self.notes.append(note)
        self.returncode = code
        self.exited.set()


class Protocol(asyncio.SubprocessProtocol):
    """The replica as our child process: its output and its exit."""

    def __init__(self, run: Run, on_end: Callable[[Run], None]) -> None:
        self.run = run
        self.on_end = on_end

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.run.output.feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.on_end(self.run)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.run.transport = transport  # before any exit can be reported

    def process_exited(self) -> None:
        transport = self.run.transport
        if isinstance(transport, asyncio.SubprocessTransport):
            self.run.returncode = transport.get_returncode()
        self.run.exited.set()


class PipeProtocol(asyncio.Protocol):
    """The output of a replica forked by the zygote: our end of its stdout pipe."""

    def __init__(self, run: Run, on_end: Callable[[Run], None]) -> None:
        self.run = run
        self.on_end = on_end

    def data_received(self, data: bytes) -> None:
        self.run.output.feed(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_end(self.run)


def spawn_failed(launch: Launch, exc: OSError) -> ReplicaExited:
    """The exit of a replica that could not be started, with why in words."""
    program = launch.argv[0]
    if isinstance(exc, FileNotFoundError):
        why = f"command not found: {program!r}"
        if not os.path.isdir(launch.cwd):
            why = f"working directory not found: {launch.cwd!r}"
    elif isinstance(exc, PermissionError):
        why = f"permission denied: {program!r} is not executable"
    else:
        why = f"cannot start {program!r}: {exc.strerror or exc}"
    ev = ExitEvidence(launch.replica, None, spawn_error=why, spawn_errno=exc.errno)
    return ReplicaExited(launch.attempt, launch.replica, launch.restart, None, ev, time.time())


_DYING_S = 2.0  # how long a replica that printed a traceback may take to exit on its own
_READING_S = NVIDIA_SMI_S + STATVFS_S + KMSG_READ_S  # a wrapper reading its node, at most


async def let_end_on_their_own(runs: Sequence[Run], ended: Collection[str]) -> None:
    """Before a stop, wait a little for the runs already ending of their own failure, so
    that their own exit is their cause, not the stop. One that printed a traceback (Python
    with torch can take a while to shut down, and its peers fail first on the closed
    connection), within `_DYING_S`; one in `ended`, whose wrapper said its program ended
    and is reading its node, within the probe's own bounds: its readings are the evidence."""
    dying = [
        r
        for r in runs
        if not r.exited.is_set() and (r.printed_traceback() or r.launch.replica in ended)
    ]
    if dying:
        reading = any(r.launch.replica in ended for r in dying)
        await asyncio.wait(
            [asyncio.ensure_future(r.exited.wait()) for r in dying],
            timeout=_READING_S if reading else _DYING_S,
        )
