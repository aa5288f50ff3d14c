"""Which processes belong to a replica run, so that every stop, restart and end takes them
all (issue 37): a replica's children that left its session or process group included.

By cgroup where this machine lets us make one (`cgroups`); otherwise this process becomes
a child subreaper (PR_SET_CHILD_SUBREAPER), so that what a replica orphans (a double fork)
is re-parented here, not to init, and a run is its process tree while it runs. What leaves
the tree that way is known by the guardian's token in its environment (`TOKEN_ENV`):
`sweep` ends the orphans that carry it once no run of the job is left, and the guardian
looks for the token when the master dies. A tree is the weaker fence: a process that
clears its environment and orphans itself is found by neither (say so: `note`).

A run whose pool sets `resources.memory` is held to it where a memory controller lets us
(`memory_limit`); where none does, the job says so once and runs unlimited.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Protocol

from trainguard.backends.local.cgroups import JobCgroups, outside_group, signal_all
from trainguard.backends.local.memory_limit import MemoryCgroups

_PR_SET_CHILD_SUBREAPER = 36
_REAP_WAIT_S = 5.0


class RunProcesses(Protocol):
    """The processes of one replica run."""

    @property
    def procs_file(self) -> str | None:
        """Where a forked child writes its own pid to join its run's own cgroup."""

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Every file a forked child writes its pid to, to join before it runs anything
        (the run's own cgroup, then its memory cgroup where that is apart)."""

    def add(self, pid: int) -> bool:
        """The run's first process (its descendants follow it)."""

    def hold(self) -> str | None:
        """Write the run's memory limit, if it has one (once): why not, if it failed."""

    def host_spawn(self) -> Callable[[], None]:
        """Make the next child of this process start inside the run; returns the call
        that undoes it (idempotent)."""

    def signal(self, sig: int, but_group: int = 0) -> None:
        """Send `sig` to every process of the run but those of the group `but_group`."""

    def oom_kills(self) -> int:
        """OOM kills only this run's own accounting saw (0 where it has none)."""

    async def kill(self) -> bool:
        """SIGKILL every process of the run; True when none is left."""

    def remove(self) -> None:
        """Release what tracked the run (call once it is empty)."""


def _ppids() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            out[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def already_exited(pid: int) -> bool:
    """True if the child has exited but is not yet reaped (peek without reaping)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie), whoever's child it is."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def descendants(root: int, ppids: dict[int, int] | None = None) -> list[int]:
    """`root` and every process below it, parents first."""
    ppids = _ppids() if ppids is None else ppids
    children: dict[int, list[int]] = {}
    for pid, ppid in ppids.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in ppids:
            out.append(pid)
        todo += children.get(pid, [])
    return out


class _Tree:
    """A run tracked as its process tree (the subreaper fallback)."""

    procs_file = None
    procs_files = ()

    def __init__(self) -> None:
        self.root = 0

    def add(self, pid: int) -> bool:
        self.root = pid
        return True

    def hold(self) -> str | None:
        return None

    def host_spawn(self) -> Callable[[], None]:
        return lambda: None  # a child is in its parent's tree from its birth

    def pids(self) -> list[int]:
        return descendants(self.root) if self.root else []

    def signal(self, sig: int, but_group: int = 0) -> None:
        signal_all(outside_group(self.pids(), but_group), sig)

    def oom_kills(self) -> int:
        return 0

    async def kill(self) -> bool:
        pids = [p for p in self.pids() if p != self.root]  # the root is someone's to reap
        signal_all(pids, signal.SIGKILL)
        return await _reap(pids)

    def remove(self) -> None:
        pass


async def _reap(pids: list[int]) -> bool:
    """Wait (bounded) for killed processes to end, reaping those re-parented to us."""
    deadline = time.monotonic() + _REAP_WAIT_S
    left = set(pids)
    while left:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours: gone once /proc says so
                done = pid if not Path(f"/proc/{pid}").exists() else 0
            if done:
                left.discard(pid)
        if not left or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.01)
    return not left


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux 3.4+)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


class Tracking:
    """How this backend knows a run's processes: cgroups, else its process tree."""

    def __init__(
        self,
        token: str,
        token_env: str,
        say: Callable[[str], None] = lambda _note: None,
        watch: Callable[[str], None] = lambda _folder: None,
    ) -> None:
        """`say`: a note for the job's record (once each); `watch`: a folder of cgroups
        made beside the run cgroups (memory), to sweep if this process dies."""
        self._needle = b"\0" + f"{token_env}={token}".encode() + b"\0"
        self._token, self._say, self._watch = token, say, watch
        self._memory: MemoryCgroups | str | None = None  # made at the first limit
        self._said: set[str] = set()
        made = JobCgroups.create(token)
        self.cgroups = made if isinstance(made, JobCgroups) else None
        if self.cgroups is not None:
            self.note = f"every process of a replica run is tracked by {self.cgroups.kind}"
        else:
            subreaper = "as a child subreaper" if become_subreaper() else "by process tree"
            self.note = (
                f"processes are tracked {subreaper}: {made}; a child that clears its "
                "environment and orphans itself may outlive its replica"
            )

    def new_run(self, memory_bytes: int | None = None) -> RunProcesses:
        """A run's tracking; held to `memory_bytes` where a memory controller lets us
        (`RunProcesses.hold` writes it), else said once and run unlimited."""
        memory = self._memory_cgroups() if memory_bytes else None
        if self.cgroups is not None:
            try:
                run = self.cgroups.new_run()
                if isinstance(memory, MemoryCgroups) and memory_bytes:
                    memory.attach(run, memory_bytes)
                return run
            except OSError as exc:
                self.say_once(f"a replica's resources.memory is not enforced: {exc}")
        return _Tree()

    def _memory_cgroups(self) -> MemoryCgroups | str:
        if self._memory is None:
            self._memory = MemoryCgroups.create(self.cgroups, self._token)
            if isinstance(self._memory, str):
                self.say_once(self._memory)
            elif self._memory.folder is not None:
                self._watch(str(self._memory.folder))
        return self._memory

    def say_once(self, note: str) -> None:
        """Say `note` unless said already (one per job, not one per run)."""
        if note not in self._said:
            self._said.add(note)
            self._say(note)

    async def sweep(self, keep: Collection[int] = ()) -> None:
        """End the orphans of this job's runs re-parented to us but `keep`, once no run is
        left (the fallback's; with cgroups each run's end took its own)."""
        if self.cgroups is not None:
            return
        me = os.getpid()
        orphans = [
            p for p, pp in _ppids().items() if pp == me and p not in keep and self._carries_token(p)
        ]
        signal_all(orphans, signal.SIGKILL)
        await _reap(orphans)

    def _carries_token(self, pid: int) -> bool:
        try:
            env = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False
        return self._needle in env

    async def close(self) -> None:
        await self.sweep()
        if self.cgroups is not None:
            await self.cgroups.close()
        if isinstance(self._memory, MemoryCgroups):
            await self._memory.close()
