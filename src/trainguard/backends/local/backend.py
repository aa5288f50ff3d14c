"""The local-process backend (R-RUN-1): each replica a child process in its own group.

Exits are learnt from the child watcher (an event, never a polling sleep); output is
read as it arrives, written to one file per replica run, kept as a tail for
classification, and tee'd to the terminal with a `[replica]` prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TextIO

from trainguard.backends.api import (
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaStarted,
    output_events,
)
from trainguard.backends.guardian import TOKEN_ENV, Guardian
from trainguard.backends.local.oom import oom_kill_count
from trainguard.backends.local.warm_start import WarmStart
from trainguard.backends.local.zygote import ZygoteError
from trainguard.backends.net import free_port
from trainguard.backends.output import RunOutput
from trainguard.hangs.snapshot import snapshot_all
from trainguard.hangs.stack_model import ReplicaSnapshot
from trainguard.policy.classes import Classification, ExitEvidence

_DYING_S = 2.0  # how long a replica that printed a traceback may take to exit on its own
_TRACEBACK = "Traceback (most recent call last):"
_DRAIN_S = 1.0  # how long to wait for the last output once a replica's group is gone


def _already_exited(pid: int) -> bool:
    """True if the child has exited but is not yet reaped (peek without reaping)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _printed_traceback(run: _Run) -> bool:
    return any(line.startswith(_TRACEBACK) for line in run.output.tail.lines())


_OnOutput = Callable[["_Run", bool, tuple[str, ...]], None]


class _Run:
    """One run of one replica: its process and its output."""

    def __init__(
        self,
        launch: Launch,
        tee: TextIO | None,
        on_output: _OnOutput,
    ) -> None:
        self.launch = launch
        self.output = RunOutput(
            launch.replica,
            launch.log_path,
            tee,
            partial(on_output, self),
        )
        self.pid = 0
        self.transport: asyncio.BaseTransport | None = None
        self.returncode: int | None = None
        self.forked = False  # by the preload zygote: not our child, its exit comes by message
        self.stop_requested = False
        self.oom_before = oom_kill_count()
        self.eof = asyncio.Event()
        self.exited = asyncio.Event()
        self.done = asyncio.Event()


class _Protocol(asyncio.SubprocessProtocol):
    def __init__(self, backend: LocalBackend, run: _Run) -> None:
        self.backend = backend
        self.run = run

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.run.output.feed(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self.backend._on_output_end(self.run)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.run.transport = transport  # before any exit can be reported

    def process_exited(self) -> None:
        transport = self.run.transport
        if isinstance(transport, asyncio.SubprocessTransport):
            self.run.returncode = transport.get_returncode()
        self.run.exited.set()


class _PipeProtocol(asyncio.Protocol):
    """The output of a replica forked by the zygote: our end of its stdout pipe."""

    def __init__(self, backend: LocalBackend, run: _Run) -> None:
        self.backend = backend
        self.run = run

    def data_received(self, data: bytes) -> None:
        self.run.output.feed(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.backend._on_output_end(self.run)


class LocalBackend:
    def __init__(
        self, tee: TextIO | None = None, host: str = "127.0.0.1", preload: Sequence[str] = ()
    ) -> None:
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self._runs: dict[str, _Run] = {}
        self._tee = tee
        self._host = host
        self._guardian: Guardian | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_output_s = 0.0
        self._warm = WarmStart(preload)
        self._forked: dict[int, _Run] = {}
        self._early_exits: dict[int, int] = {}

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._warm.notes

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        """When any replica (of `replicas`) last printed anything (0 if none has yet)."""
        if replicas is None:
            return self._last_output_s
        runs = [self._runs[r] for r in replicas if r in self._runs]
        return max((run.output.last_s for run in runs), default=0.0)

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit

    async def channel_host(self) -> str:
        return "127.0.0.1"  # every replica runs on this machine

    async def rendezvous(self) -> tuple[str, int]:
        port = await self._warm.store_port(self._host)
        return self._host, free_port(self._host) if port is None else port

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        return {r: kept.get(r) or f"{self._host}:{free_port(self._host)}" for r in replicas}

    # -------------------------------------------------------------- start

    async def start(self, launches: Sequence[Launch]) -> None:
        if self._guardian is None:
            self._guardian = Guardian()
        await self._warm.plan(launches, self._forked_exit)
        launches = await self._warm.with_hosted_store(launches)
        loop = asyncio.get_running_loop()
        for launch in launches:
            if self._warm.why_cold(launch) is None:
                await self._spawn_forked(loop, launch)
            else:
                await self._spawn(loop, launch)

    async def _spawn_forked(self, loop: asyncio.AbstractEventLoop, launch: Launch) -> None:
        zygote = self._warm.zygote
        assert zygote is not None
        run = _Run(launch, self._tee, self._on_output)
        run.forked = True
        r, w = os.pipe()
        try:
            run.pid = await zygote.spawn(launch.argv, launch.env, launch.cwd, w)
        except ZygoteError:
            os.close(r)
            run.output.close()
            await self._spawn(loop, launch)  # the ordinary way
            return
        finally:
            os.close(w)
        assert self._guardian is not None
        self._guardian.watch(run.pid)
        self._forked[run.pid] = run
        if run.pid in self._early_exits:  # it exited before we knew its pid
            self._forked_exit(run.pid, self._early_exits.pop(run.pid))
        transport, _ = await loop.connect_read_pipe(
            lambda: _PipeProtocol(self, run),
            os.fdopen(r, "rb", buffering=0),
        )
        run.transport = transport
        self._started(run)

    def _forked_exit(self, pid: int, code: int) -> None:
        run = self._forked.pop(pid, None)
        if run is None:
            self._early_exits[pid] = code  # its pid message is still on its way to spawn()
            return
        run.returncode = code
        run.exited.set()

    async def _spawn(self, loop: asyncio.AbstractEventLoop, launch: Launch) -> None:
        """Start one replica as a child process in a new session (its own group).

        No `preexec_fn`: with one, CPython's `_posixsubprocess` must fork() the whole
        master (page tables, and every thread's locks in an undefined state) and run
        Python in the child; without one, and with only `start_new_session` (setsid in
        the child), it uses vfork() + exec, which costs the same however large the
        master is. What the preexec did (PR_SET_PDEATHSIG, so that a master killed by
        SIGKILL takes the replica along) is the guardian's job instead, and it keeps
        the window between the fork and `+PID` closed: the spawn is announced before
        the fork and answered after it, and the child carries the guardian's token in
        its environment, so a master that dies in between leaves an unanswered spawn,
        and the guardian finds the replica by its token (see `_guardian`).
        """
        guardian = self._guardian
        assert guardian is not None
        run = _Run(launch, self._tee, self._on_output)
        guardian.spawning()
        pid: int | None = None
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: _Protocol(self, run),
                *launch.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**launch.env, TOKEN_ENV: guardian.token},
                cwd=launch.cwd,
                start_new_session=True,
            )
            pid = transport.get_pid()
        except OSError as exc:
            run.output.close()
            self._emit(self._spawn_failed(launch, exc))
            return
        finally:
            guardian.spawned(pid)  # from here on the guardian has its group
        run.transport = transport
        run.pid = transport.get_pid()
        self._started(run)

    def _started(self, run: _Run) -> None:
        launch = run.launch
        self._runs[launch.replica] = run
        self._emit(
            ReplicaStarted(launch.attempt, launch.replica, launch.restart, run.pid, time.time())
        )
        task = asyncio.create_task(self._watch(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn_failed(self, launch: Launch, exc: OSError) -> ReplicaExited:
        program = launch.argv[0]
        if isinstance(exc, FileNotFoundError):
            why = f"command not found: {program!r}"
            if not os.path.isdir(launch.cwd):
                why = f"working directory not found: {launch.cwd!r}"
        elif isinstance(exc, PermissionError):
            why = f"permission denied: {program!r} is not executable"
        else:
            why = f"cannot start {program!r}: {exc.strerror or exc}"
        ev = ExitEvidence(launch.replica, None, spawn_error=why)
        return ReplicaExited(launch.attempt, launch.replica, launch.restart, None, ev, time.time())

    # -------------------------------------------------------------- output

    def _on_output(self, run: _Run, first: bool, segments: tuple[str, ...]) -> None:
        self._last_output_s = time.time()
        for ev in output_events(run.launch, first, segments, self._last_output_s):
            self._emit(ev)

    def _on_output_end(self, run: _Run) -> None:
        run.output.end()
        run.eof.set()

    def log_tail(self, replica: str) -> tuple[str, ...]:
        run = self._runs.get(replica)
        return run.output.tail.lines() if run else ()

    def current_run(self, replica: str) -> tuple[int, int, int] | None:
        """(attempt, restart, pid) of the replica's run still going, or None (a backend
        built on this one reports a run lost before its process ends)."""
        run = self._runs.get(replica)
        if run is None or run.done.is_set():
            return None
        return run.launch.attempt, run.launch.restart, run.pid

    # -------------------------------------------------------------- exit

    async def _watch(self, run: _Run) -> None:
        await run.exited.wait()
        seen_s = time.time()
        assert run.transport is not None
        returncode = run.returncode
        # The replica is its process group: whatever it left behind goes with it.
        self._killpg(run, signal.SIGKILL)
        if self._guardian is not None:
            self._guardian.forget(run.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.eof.wait(), _DRAIN_S)
        run.transport.close()
        run.output.close()
        launch = run.launch
        if self._runs.get(launch.replica) is run:
            del self._runs[launch.replica]
        run.done.set()
        self._emit(
            ReplicaExited.of(
                launch,
                run.pid,
                seen_s,
                returncode,
                stop_requested=run.stop_requested,
                log_tail=run.output.tail.lines(),
                oom_kills=max(0, oom_kill_count() - run.oom_before),
            )
        )

    @staticmethod
    def _killpg(run: _Run, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, sig)

    # -------------------------------------------------------------- stop

    async def signal(self, replica: str, signum: int) -> bool:
        run = self._runs.get(replica)
        if run is None or run.done.is_set() or not run.pid:
            return False
        try:
            os.kill(run.pid, signum)  # the replica itself, as a fault would hit it
        except ProcessLookupError:
            return False
        return True

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        runs = [self._runs[r] for r in replicas if r in self._runs]
        if not runs:
            return
        # One that has printed a traceback is most likely exiting of its own error (Python
        # with torch can take a while to shut down, and its peers fail first on the closed
        # connection): let it end on its own, so its own exit is its cause, not our stop.
        dying = [r for r in runs if not r.exited.is_set() and _printed_traceback(r)]
        if dying:
            await asyncio.wait(
                [asyncio.ensure_future(r.exited.wait()) for r in dying], timeout=_DYING_S
            )
        for run in runs:
            # One that already died on its own (a zombie not yet reaped) keeps its own
            # exit: it may be the root cause, and is not the master's doing.
            gone = run.exited.is_set() if run.forked else _already_exited(run.pid)
            run.stop_requested = not gone
            self._killpg(run, signal.SIGTERM)
            self._killpg(run, signal.SIGCONT)  # a stopped (SIGSTOP) group must see the TERM
        waits = [asyncio.ensure_future(run.done.wait()) for run in runs]
        _, pending = await asyncio.wait(waits, timeout=grace_s)
        if pending:
            for run in runs:
                if not run.done.is_set():
                    self._killpg(run, signal.SIGKILL)
            await asyncio.wait(pending)

    async def snapshot(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaSnapshot]:
        return await snapshot_all(
            targets, timeout_s=timeout_s, faulthandler_files=faulthandler_files
        )

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        return None  # one machine: GPU isolation is the GpuPool's

    async def close(self) -> None:
        await self.stop(list(self._runs), grace_s=5.0)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._warm.close()
        if self._guardian is not None:
            self._guardian.close()
            self._guardian = None
