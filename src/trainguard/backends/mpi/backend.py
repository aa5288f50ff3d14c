"""An MPI job on the local backend: the launcher runs mpirun, its ranks are the workers.

trainguard starts one process, the launcher (`mpirun` over a hostfile of the job's slots);
mpirun starts the ranks. They are still supervised as the `worker-<i>` replicas:
- their pids are found under mpirun (`find_ranks`) and reported as they appear, so records
  name them and a hang's stack dump reaches them with py-spy;
- mpirun's `--tag-output` stream, which the inner backend writes to the launcher's log,
  is split into one log (and tail) per rank;
- their exits are reported when mpirun ends (a rank's death makes mpirun abort the job):
  the rank mpirun blames gets the signal or status it names, the others count as stopped
  by mpirun, or as exited 0 when mpirun succeeded. Each exit carries the time its process
  vanished, so the blamed rank, not mpirun's own exit, is the root cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from trainguard.backends.interface import (
    Backend,
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaStarted,
    output_events,
)
from trainguard.backends.mpi.launch import (
    ALLOW_ROOT_ENV,
    TagDemux,
    exit_on_error,
    find_ranks,
    hostfile_text,
    mpirun_argv,
    parse_rank_failure,
)
from trainguard.backends.output import RunOutput
from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.storage.private import private_dir, private_file

_POLL_S = 0.05
LAUNCHER_ROLE = "launcher"


@dataclass
class _Rank:
    launch: Launch
    output: RunOutput
    pid: int | None = None
    gone_s: float | None = None


@dataclass
class _Job:
    """One attempt of the MPI job: mpirun and its ranks."""

    launcher: Launch
    ranks: dict[int, _Rank]
    log_offset: int = 0
    demux: TagDemux = field(default_factory=TagDemux)
    mpirun_lines: list[str] = field(default_factory=list)
    pid: int | None = None
    stop_requested: bool = False
    task: asyncio.Task[None] | None = None
    find_every_s: float = _POLL_S  # grows while ranks stay missing: /proc walks cost CPU
    next_find_s: float = 0.0


class MpiBackend:
    def __init__(self, inner: Backend) -> None:
        self._inner = inner
        self._emit: Callable[[BackendEvent], None] = lambda _e: None
        self._job: _Job | None = None

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit
        self._inner.bind(self._from_inner)

    async def channel_host(self) -> str:
        return "127.0.0.1"  # every replica runs on this machine

    async def rendezvous(self) -> tuple[str, int]:
        return await self._inner.rendezvous()

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        return await self._inner.task_addresses(replicas, kept)

    # -------------------------------------------------------------- start

    async def start(self, launches: Sequence[Launch]) -> None:
        launchers = [la for la in launches if _is_launcher(la)]
        ranks = sorted((la for la in launches if not _is_launcher(la)), key=lambda la: la.rank)
        if not launchers:  # a rank cannot be started alone: mpirun starts them all
            for la in ranks:
                ev = ExitEvidence(
                    la.replica, None, spawn_error="an MPI rank starts only with mpirun"
                )
                self._emit(ReplicaExited(la.attempt, la.replica, la.restart, None, ev, time.time()))
            return
        (launcher,) = launchers
        hostfile = launcher.log_path.parent / "mpi-hostfile"
        private_dir(hostfile.parent)
        private_file(hostfile).write_text(hostfile_text([("127.0.0.1", max(1, len(ranks)))]))
        program = exit_on_error(list(ranks[0].argv)) if ranks else ["true"]
        names = sorted(k for k in launcher.env if k.startswith("TRAINGUARD_"))
        own = list(launcher.argv)  # `mpirun` and the user's own flags
        argv = mpirun_argv(own[0], hostfile, len(ranks), program, names)
        argv = argv[:1] + own[1:] + argv[1:]
        job = _Job(launcher, {i: self._rank(la) for i, la in enumerate(ranks)})
        self._job = job
        env = {**launcher.env, **ALLOW_ROOT_ENV}
        await self._inner.start([replace(launcher, argv=tuple(argv), env=env)])
        if self._job is job and job.pid is not None:
            job.task = asyncio.create_task(self._follow(job))

    def _rank(self, launch: Launch) -> _Rank:
        def on_output(first: bool, segments: tuple[str, ...]) -> None:
            for ev in output_events(launch, first, segments, time.time()):
                self._emit(ev)

        return _Rank(launch, RunOutput(launch.replica, launch.log_path, None, on_output))

    async def _follow(self, job: _Job) -> None:
        """Until mpirun exits: find the ranks, split the output, note which ranks vanished."""
        while self._job is job:
            self._read(job)
            missing = any(r.pid is None for r in job.ranks.values())
            if job.pid is not None and missing and time.monotonic() >= job.next_find_s:
                job.find_every_s = min(2.0, job.find_every_s * 1.2)  # a rank may never show
                job.next_find_s = time.monotonic() + job.find_every_s
                found = await asyncio.to_thread(find_ranks, job.pid)
                for index, pid in found.items():
                    rank = job.ranks.get(index)
                    if rank is not None and rank.pid is None and self._job is job:
                        rank.pid = pid
                        la = rank.launch
                        self._emit(
                            ReplicaStarted(la.attempt, la.replica, la.restart, pid, time.time())
                        )
            for rank in job.ranks.values():
                if rank.pid is not None and rank.gone_s is None and not _alive(rank.pid):
                    rank.gone_s = time.time()
            await asyncio.sleep(_POLL_S)

    def _read(self, job: _Job) -> None:
        """The launcher's log from where we were: rank lines to their logs, mpirun's kept."""
        try:
            with open(job.launcher.log_path, "rb") as fh:
                fh.seek(job.log_offset)
                data = fh.read()
        except OSError:
            return
        job.log_offset += len(data)
        self._route(job, job.demux.feed(data))

    def _route(self, job: _Job, lines: list[tuple[int | None, str]]) -> None:
        for index, text in lines:
            rank = job.ranks.get(index) if index is not None else None
            if rank is None:
                job.mpirun_lines.append(text)
                del job.mpirun_lines[:-200]
            else:
                rank.output.feed(text.encode() + b"\n")

    # -------------------------------------------------------------- events from mpirun's side

    def _from_inner(self, ev: BackendEvent) -> None:
        job = self._job
        if job is None or ev.replica != job.launcher.replica or ev.attempt != job.launcher.attempt:
            self._emit(ev)
            return
        if isinstance(ev, ReplicaStarted):
            job.pid = ev.pid
        elif isinstance(ev, ReplicaExited):
            self._ended(job, ev)
        self._emit(ev)

    def _ended(self, job: _Job, ev: ReplicaExited) -> None:
        """mpirun is gone: every rank's exit, then (by the caller) mpirun's own."""
        self._job = None
        if job.task is not None:
            job.task.cancel()
        self._read(job)
        self._route(job, job.demux.close())
        blamed = parse_rank_failure(job.mpirun_lines)
        ok = ev.evidence.returncode == 0
        for index, rank in job.ranks.items():
            rank.output.close()
            if rank.pid is not None and rank.gone_s is None and not _alive(rank.pid):
                rank.gone_s = ev.time_s
            code: int | None
            if blamed is not None and blamed.rank == index:
                code, by_mpirun = blamed.returncode, False
            else:
                code, by_mpirun = (0 if ok else -signal.SIGTERM), not ok
            at = min(rank.gone_s or ev.time_s, ev.time_s)
            self._emit(
                ReplicaExited.of(
                    rank.launch,
                    rank.pid,
                    at,
                    code,
                    stop_requested=job.stop_requested or by_mpirun,
                    log_tail=rank.output.tail.lines(),
                )
            )

    # -------------------------------------------------------------- stop, diagnosis, close

    async def signal(self, replica: str, signum: int) -> bool:
        job = self._job
        rank = next(
            (r for r in (job.ranks.values() if job else ()) if r.launch.replica == replica), None
        )
        if rank is None:
            return await self._inner.signal(replica, signum)
        if rank.pid is None or rank.gone_s is not None:
            return False
        try:
            os.kill(rank.pid, signum)  # a rank of mpirun's, on this machine
        except ProcessLookupError:
            return False
        return True

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        """mpirun takes its ranks along (TERM, then KILL after 1 s); stragglers get SIGKILL."""
        job = self._job
        if job is None:
            await self._inner.stop(replicas, grace_s)
            return
        names = {r.launch.replica for r in job.ranks.values()}
        if job.launcher.replica in replicas or names & set(replicas):
            job.stop_requested = True
            pids = [r.pid for r in job.ranks.values() if r.pid is not None]
            await self._inner.stop([job.launcher.replica], max(grace_s, 3.0))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        rest = [r for r in replicas if r != job.launcher.replica and r not in names]
        if rest:
            await self._inner.stop(rest, grace_s)

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        return self._inner.last_output_s(replicas)

    def log_tail(self, replica: str) -> tuple[str, ...]:
        job = self._job
        if job is not None:
            for rank in job.ranks.values():
                if rank.launch.replica == replica:
                    return rank.output.tail.lines()
        return self._inner.log_tail(replica)

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        return await self._inner.dump_stacks(targets, timeout_s, faulthandler_files)

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        return self._inner.isolate_after(replica, c)

    async def close(self) -> None:
        job = self._job
        if job is not None:
            await self.stop([job.launcher.replica], 3.0)
        await self._inner.close()

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._inner.warm_start_notes


def _is_launcher(launch: Launch) -> bool:
    return launch.replica.startswith(f"{LAUNCHER_ROLE}-")


def _alive(pid: int) -> bool:
    """Running (a zombie mpirun has not reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False
