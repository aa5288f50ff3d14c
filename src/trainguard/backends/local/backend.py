"""The local-process backend (R-RUN-1): each replica a child process in its own group, and
each run's processes, wherever they went (a new session, a double fork), in its own cgroup
(`tracking`): all of them end with the run.

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
from pathlib import Path
from typing import TextIO

from trainguard.backends.guardian import TOKEN_ENV, Guardian
from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaStarted,
    output_events,
)
from trainguard.backends.local.node_layout import NodeLayout, without_own
from trainguard.backends.local.oom import exit_readings, memory_reading
from trainguard.backends.local.run import (
    PipeProtocol,
    Protocol,
    Run,
    let_end_on_their_own,
    spawn_failed,
)
from trainguard.backends.local.tracking import RunProcesses, Tracking, alive, already_exited
from trainguard.backends.local.warm_start import WarmStart
from trainguard.backends.local.zygote import ZygoteError
from trainguard.backends.net import free_port
from trainguard.classify.classes import Classification
from trainguard.classify.own_errors import zygote_death_note
from trainguard.hangs.stack_dumps import dump_stacks
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.signals import signal_name

_DRAIN_S = 1.0  # how long to wait for the last output once a replica's group is gone
_KILLED_S = 5.0  # how long a forked replica's exit may take to come once it was SIGKILLed


class LocalBackend:
    def __init__(
        self,
        tee: TextIO | None = None,
        host: str = "127.0.0.1",
        preload: Sequence[str] = (),
        one_node: bool = False,
        own_machine: bool | None = None,
    ) -> None:
        """`one_node`: this backend is the job's, its machine the job's one node (GPUs
        laid out as torchrun's, `node_layout`); not where another backend (Slurm) starts
        its own, laid-out launches through it. `own_machine` (default: `one_node`): the
        replicas' programs run on this machine, which holds them to their memory limit and
        is read when one fails: a node's agent, not the srun processes of a Slurm job."""
        self._layout = NodeLayout() if one_node else None
        self._own_machine = one_node if own_machine is None else own_machine
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self._runs: dict[str, Run] = {}
        self._tee = tee
        self._host = host
        self._guardian: Guardian | None = None
        self._tracking: Tracking | None = None  # every process of each run (cgroup)
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_output_s = 0.0
        self._warm = WarmStart(preload)
        self._forked: dict[int, Run] = {}
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
        if self._layout is not None:
            launches = self._layout.apply(launches)
        else:
            launches = [without_own(la) for la in launches]
        await self.warm(launches)
        launches = await self._warm.with_hosted_store(launches)
        loop = asyncio.get_running_loop()
        for launch in launches:
            if self._warm.why_cold(launch) is None:
                await self._spawn_forked(loop, launch)
            else:
                await self._spawn(loop, launch)

    async def warm(self, launches: Sequence[Launch]) -> None:
        """The guardian, and the zygote planned for `launches` (once): at the first start,
        or ahead of any (a spare node's agent, so a restart there forks warm)."""
        if self._guardian is None:
            self._guardian = Guardian()
            self._tracking = Tracking(
                self._guardian.token,
                TOKEN_ENV,
                self._warm.notes.append,
                self._guardian.sweep_cgroups,
            )
            if self._tracking.cgroups is not None:
                self._guardian.sweep_cgroups(str(self._tracking.cgroups.folder))
            else:  # the weaker fence: say so where the warm start's notes are recorded
                self._guardian.sweep_token()
                self._warm.notes.append(self._tracking.note)
        await self._warm.plan(launches, self._forked_exit, self._zygote_died)

    async def _spawn_forked(self, loop: asyncio.AbstractEventLoop, launch: Launch) -> None:
        zygote = self._warm.zygote
        assert zygote is not None
        assert self._guardian is not None and self._tracking is not None
        run = Run(launch, self._tee, self._on_output, self._new_run(launch))
        run.forked = True
        self._hold(run)  # before it joins: it is held from birth
        env = {**launch.env, TOKEN_ENV: self._guardian.token}  # for what it execs
        r, w = os.pipe()
        try:
            run.pid = await zygote.spawn(
                launch.argv, env, launch.cwd, w, cgroup=run.processes.procs_files
            )
        except ZygoteError:
            os.close(r)
            run.output.close()
            run.processes.remove()
            await self._spawn(loop, launch)  # the ordinary way
            return
        finally:
            os.close(w)
        run.processes.add(run.pid)
        self._guardian.watch(run.pid)
        self._forked[run.pid] = run
        if run.pid in self._early_exits:  # it exited before we knew its pid
            self._forked_exit(run.pid, self._early_exits.pop(run.pid))
        transport, _ = await loop.connect_read_pipe(
            lambda: PipeProtocol(run, self._on_output_end),
            os.fdopen(r, "rb", buffering=0),
        )
        run.transport = transport
        self._started(run)

    def _forked_exit(self, pid: int, code: int) -> None:
        run = self._forked.pop(pid, None)
        if run is None:
            self._early_exits[pid] = code  # its pid message is still on its way to spawn()
            return
        run.exit_with(code)

    def _zygote_died(self, code: int) -> None:
        """The zygote is gone, and with it every replica it forked (PR_SET_PDEATHSIG):
        each is reported exited now, with what is known (no exit of theirs will come)."""
        how = f"killed by {signal_name(-code)}" if code < 0 else f"exited with {code}"
        note = zygote_death_note(how)  # for the log tail; the classifier reads the field
        for run in self._forked.values():
            run.zygote_died = how
            run.exit_with(-signal.SIGKILL, note)  # what PR_SET_PDEATHSIG sends
        self._forked.clear()

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
        and the guardian finds the replica by its token (see `_guardian`). For the same
        reason the master stands in the run's cgroup while it forks: the child is born
        there, before its program can start anything (`RunCgroup.host_spawn`).
        """
        guardian, tracking = self._guardian, self._tracking
        assert guardian is not None and tracking is not None
        run = Run(launch, self._tee, self._on_output, self._new_run(launch))
        guardian.spawning()
        pid: int | None = None
        leave = run.processes.host_spawn()  # the child is born in the run's cgroup
        loop.call_soon(leave)  # back at the loop's next turn: the fork is done by then
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: Protocol(run, self._on_output_end),
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
            leave()
            run.output.close()
            run.processes.remove()
            self._emit(spawn_failed(launch, exc))
            return
        finally:
            leave()
            guardian.spawned(pid)  # from here on the guardian has its group
        run.transport = transport
        run.pid = transport.get_pid()
        run.processes.add(run.pid)  # the tree's root (in a cgroup it was born inside)
        self._hold(run)  # now that this process has left its cgroup (`memory_limit`)
        self._started(run)

    def _new_run(self, launch: Launch) -> RunProcesses:
        """The run's tracking, held to its pool's resources.memory on the job's own node
        (not the srun processes of a Slurm job: Slurm holds its steps)."""
        assert self._tracking is not None
        return self._tracking.new_run(launch.memory_bytes if self._own_machine else None)

    def _hold(self, run: Run) -> None:
        why = run.processes.hold()
        if why is not None and self._tracking is not None:
            self._tracking.say_once(f"a replica's resources.memory is not enforced: {why}")

    _spawn_failed = staticmethod(spawn_failed)  # (moved to `run`; tests still call it here)

    def _started(self, run: Run) -> None:
        launch = run.launch
        self._runs[launch.replica] = run
        self._emit(
            ReplicaStarted(launch.attempt, launch.replica, launch.restart, run.pid, time.time())
        )
        task = asyncio.create_task(self._watch(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -------------------------------------------------------------- output

    def _on_output(self, run: Run, first: bool, segments: tuple[str, ...]) -> None:
        self._last_output_s = time.time()
        for ev in output_events(run.launch, first, segments, self._last_output_s):
            self._emit(ev)

    def _on_output_end(self, run: Run) -> None:
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

    async def _watch(self, run: Run) -> None:
        await run.exited.wait()
        seen_s = time.time()
        assert run.transport is not None
        returncode = run.returncode
        oom_kills = run.oom_kills()  # before its cgroup, which may count them, goes
        failed = returncode and not run.stop_requested and self._own_machine
        memory = memory_reading(run) if failed else None  # not srun's host under Slurm
        # Whatever it left behind goes with it: its group, and what left the group (a new
        # session, a double fork, a child holding its output pipe) by its cgroup.
        self._killpg(run, signal.SIGKILL)
        await run.processes.kill()
        run.processes.remove()
        if self._guardian is not None:
            self._guardian.forget(run.pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.eof.wait(), _DRAIN_S)
        run.transport.close()
        run.output.close()
        launch = run.launch
        tail = (*run.output.tail.lines(), *run.notes)
        machine = () if memory is None else await exit_readings(run, memory, tail)  # bounded
        # Live until its exit is told: a stop meanwhile waits for it (`done`), so the
        # master records it with its attempt, not as a stray exit of an earlier one.
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
                log_tail=tail,
                oom_kills=oom_kills,
                machine=machine,
                zygote_died=run.zygote_died,
            )
        )

    @staticmethod
    def _killpg(run: Run, sig: int) -> None:
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

    async def stop(
        self, replicas: Sequence[str], grace_s: float, ended: Collection[str] = ()
    ) -> None:
        """`ended`: replicas whose program a backend built on this one knows has already
        exited on its own (its wrapper still at work): their exits are not our stop's."""
        runs = [self._runs[r] for r in replicas if r in self._runs]
        if not runs:
            return
        await let_end_on_their_own(runs, ended)
        for run in runs:
            # One that already died on its own (a zombie not yet reaped) keeps its own
            # exit: it may be the root cause, and is not the master's doing.
            gone = run.exited.is_set() if run.forked else already_exited(run.pid)
            gone = gone or run.launch.replica in ended
            run.stop_requested = not gone
            for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped one must see the TERM
                self._killpg(run, sig)
                run.processes.signal(sig, but_group=run.pid)  # and what left its group
        waits = [asyncio.ensure_future(run.done.wait()) for run in runs]
        _, pending = await asyncio.wait(waits, timeout=grace_s)
        if pending:
            for run in runs:
                if not run.done.is_set():
                    self._killpg(run, signal.SIGKILL)
                    run.processes.signal(signal.SIGKILL, but_group=run.pid)
            _, pending = await asyncio.wait(pending, timeout=_KILLED_S)
            for run in runs:  # a forked one whose exit its zygote never sent: it is gone
                if run.forked and not run.done.is_set() and not alive(run.pid):
                    run.exit_with(-signal.SIGKILL, "trainguard: killed; no exit status came")
            if pending:
                await asyncio.wait(pending)
        if self._tracking is not None and not self._runs:  # what they orphaned (fallback)
            await self._tracking.sweep()

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        return await dump_stacks(
            targets, timeout_s=timeout_s, faulthandler_files=faulthandler_files
        )

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        return None  # one machine: GPU isolation is the GpuPool's

    async def close(self) -> None:
        await self.stop(list(self._runs), grace_s=5.0)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._warm.close()
        if self._tracking is not None:
            await self._tracking.close()
        if self._guardian is not None:
            self._guardian.sweep_token(False)  # nothing of ours is left to look for
            self._guardian.close()
            self._guardian = None
