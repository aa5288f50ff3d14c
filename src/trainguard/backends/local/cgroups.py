"""Every process a replica run starts ends with it (issue 37): a cgroup per run.

A process group or session is no fence: a child started with `start_new_session=True`,
`process_group=0` or a double fork leaves both, and outlives a `killpg`. A cgroup is
inherited by every descendant and cannot be left without privileges the replica is not
meant to use, so the run's cgroup is the set of its processes, whatever they did.

Where: under this process's own cgroup (nested, so the limits of an outer manager, Slurm's
step or a systemd unit, still apply), in the first hierarchy that lets us create one and
move a process into it: cgroup v2 first (`cgroup.kill` ends a whole subtree at once, races
with fork included), then v1's `pids`, `freezer` and `memory` controllers (killed by reading
`cgroup.procs` and signalling until it stays empty). None usable: `JobCgroups.create` says
why, and the backend falls back to being a child subreaper (`subreaper`).

A v1 memory cgroup counts its own OOM kills (they do not reach its parent's counter): a
run's `oom_kills` reads it, so the OOM evidence stays right wherever the run lives. A run
held to its `resources.memory` may have a companion: the same run in v1's memory hierarchy
(`memory_limit`), joined, emptied and removed with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_V1_CONTROLLERS = ("pids", "freezer", "memory")
_EMPTY_WAIT_S = 5.0  # how long killed processes may take to leave their cgroup


@dataclass(frozen=True)
class Hierarchy:
    """A mounted cgroup hierarchy and where this process sits in it."""

    mount: Path
    own: str  # this process's cgroup, relative to the mount
    v2: bool
    controller: str = ""  # the v1 controller it was mounted with

    @property
    def home(self) -> Path:
        return self.mount / self.own.lstrip("/")


def hierarchies(proc_cgroup: str | None = None, mountinfo: str | None = None) -> list[Hierarchy]:
    """The hierarchies a run's cgroup could live in, best first (v2, then v1 pids, freezer,
    memory), from /proc/self/cgroup and /proc/self/mountinfo."""
    try:
        if proc_cgroup is None:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        if mountinfo is None:
            mountinfo = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    mounts: dict[str, tuple[str, Path]] = {}  # "" for v2, else the v1 controller
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        names = [""] if tail[0] == "cgroup2" else tail[2].split(",") if tail[0] == "cgroup" else []
        for name in names:  # (the cgroup mounted there, where)
            mounts.setdefault(name, (fields[3], Path(fields[4])))
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in controllers.split(",") if controllers else [""]:
            own.setdefault(name, path)
    out: list[Hierarchy] = []
    for name in ("", *_V1_CONTROLLERS):
        if name not in mounts or name not in own:
            continue
        root, mount = mounts[name]
        path = own[name]
        if root != "/" and (path == root or path.startswith(root + "/")):
            path = path[len(root) :] or "/"  # a subtree mounted (a container's own)
        out.append(Hierarchy(mount, path, v2=not name, controller=name))
    return out


def _pids(folder: Path) -> list[int]:
    """The processes of `folder` and of every cgroup below it."""
    found: list[int] = []
    for procs in folder.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(x) for x in procs.read_text().split()]
    return found


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send `sig` to each of `pids` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def outside_group(pids: Iterable[int], pgid: int) -> list[int]:
    """Those of `pids` that are not in the process group `pgid` (0: all of them)."""
    out = []
    for pid in pids:
        try:
            if not pgid or os.getpgid(pid) != pgid:
                out.append(pid)
        except ProcessLookupError:
            continue
    return out


def _remove_tree(folder: Path) -> None:
    """rmdir `folder` and the cgroups below it, deepest first (each must be empty)."""
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir():
            with contextlib.suppress(OSError):
                sub.rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()


class RunCgroup:
    """The cgroup of one replica run: the processes it started, wherever they went."""

    def __init__(self, path: Path, v2: bool, home: Path | None = None) -> None:
        self.path = path
        self._v2 = v2
        self._home = home  # the cgroup this process lives in, to come back to
        self.companions: list[RunCgroup] = []  # the same run in another hierarchy (memory)
        self.pending_limit: Callable[[], None] | None = None  # `memory_limit`'s, for `hold`

    def host_spawn(self) -> Callable[[], None]:
        """Move this process into the run's cgroup, so that the child it starts next is
        born inside (no window in which it could start something outside); returns the
        call that moves it back (idempotent). A child started by vfork + exec cannot be
        moved before it runs, and a replica's program may fork at once."""
        leaves = [c.host_spawn() for c in self.companions]  # none holds its limit yet
        moved = self._home is not None and self._join(os.getpid())
        home = self._home

        def leave() -> None:
            nonlocal moved
            if moved and home is not None:
                moved = False
                with contextlib.suppress(OSError):
                    (home / "cgroup.procs").write_text(str(os.getpid()))
            for back in leaves:
                back()

        return leave

    @property
    def procs_file(self) -> str:
        """Where a process writes its own pid to join (a child forked by the zygote)."""
        return str(self.path / "cgroup.procs")

    @property
    def procs_files(self) -> tuple[str, ...]:
        """Every `cgroup.procs` a forked child joins: this run's, then its companions'."""
        return (self.procs_file, *(c.procs_file for c in self.companions))

    def _join(self, pid: int) -> bool:
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError:  # it exited already, or the folder is gone
            return False
        return True

    def add(self, pid: int) -> bool:
        for companion in self.companions:
            companion.add(pid)
        return self._join(pid)

    def hold(self) -> str | None:
        """Write the run's memory limit (once; `memory_limit`): None, or why it could not
        (the run goes on unlimited)."""
        pending, self.pending_limit = self.pending_limit, None
        if pending is not None:
            try:
                pending()
            except OSError as exc:
                return str(exc)
        return None

    @property
    def memory_path(self) -> Path | None:
        """The run's own memory cgroup (its counters, its limit), if it has one."""
        for group in (self, *self.companions):
            if any((group.path / f).is_file() for f in ("memory.events", "memory.oom_control")):
                return group.path
        return None

    def pids(self) -> list[int]:
        found = _pids(self.path)
        for companion in self.companions:  # the same processes, unless one failed to join
            found += [p for p in companion.pids() if p not in found]
        return found

    def signal(self, sig: int, but_group: int = 0) -> None:
        """Send `sig` to every process of the run (the stop's SIGTERM, SIGCONT) but those
        of the process group `but_group` (already signalled with their group)."""
        signal_all(outside_group(self.pids(), but_group), sig)

    def oom_kills(self) -> int:
        """OOM kills counted by this cgroup itself (a v1 memory cgroup); 0 elsewhere."""
        kills = sum(c.oom_kills() for c in self.companions)
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return kills + int(value)
        return kills

    async def kill(self) -> bool:
        """SIGKILL every process of the run and wait (bounded) until none is left; True
        when the cgroup is empty."""
        deadline = time.monotonic() + _EMPTY_WAIT_S
        pause = 0.001
        while True:
            if self._v2:
                with contextlib.suppress(OSError):
                    (self.path / "cgroup.kill").write_text("1")
            pids = self.pids()
            if not pids:
                return True
            if not self._v2 or self.companions:
                signal_all(pids, signal.SIGKILL)  # again each round: forks in between
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.05)

    def remove(self) -> None:
        for companion in self.companions:
            companion.remove()
        _remove_tree(self.path)


class JobCgroups:
    """The folder of one backend's run cgroups (`trainguard-<token>` under our own)."""

    def __init__(self, folder: Path, hierarchy: Hierarchy) -> None:
        self.folder = folder
        self.hierarchy = hierarchy
        self._next = 0

    @classmethod
    def create(cls, token: str, among: Sequence[Hierarchy] | None = None) -> JobCgroups | str:
        """A folder in the first hierarchy (of `among`, default all) where a probe can join
        a cgroup we made, or why there is none (the caller falls back to a subreaper)."""
        why: list[str] = []
        for h in hierarchies() if among is None else among:
            folder = h.home / f"trainguard-{token[:12]}"
            try:
                folder.mkdir()
                probe = folder / "probe"
                probe.mkdir()
                # Joining and leaving proves we may move processes here (v2's rules on
                # delegation and internal processes, v1's permissions).
                (probe / "cgroup.procs").write_text(str(os.getpid()))
                (h.home / "cgroup.procs").write_text(str(os.getpid()))
                probe.rmdir()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    (h.home / "cgroup.procs").write_text(str(os.getpid()))
                _remove_tree(folder)
                kind = "v2" if h.v2 else f"v1 {h.controller}"
                why.append(f"{kind} at {h.home}: {exc.strerror or exc}")
                continue
            return cls(folder, h)
        return "no cgroup we may use (" + ("; ".join(why) or "none mounted") + ")"

    @property
    def kind(self) -> str:
        return "cgroup v2" if self.hierarchy.v2 else f"cgroup v1 ({self.hierarchy.controller})"

    def new_run(self) -> RunCgroup:
        self._next += 1
        path = self.folder / f"run-{self._next}"
        path.mkdir()
        return RunCgroup(path, self.hierarchy.v2, self.hierarchy.home)

    async def close(self) -> None:
        """Kill whatever is left in any run's cgroup, then remove them all."""
        await RunCgroup(self.folder, self.hierarchy.v2).kill()
        _remove_tree(self.folder)
