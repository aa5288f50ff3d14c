"""A replica held to its own `resources.memory` (issue 38): a memory limit on its run.

Without one, a hog grows until its node's limit or the machine's OOM killer acts, and the
kill is read from a counter it shares with every other process. With one, the kernel kills
it at its own limit, and its run's own cgroup counts the kill: a sure host OOM.

Where: cgroup v2's `memory.max` (`memory.swap.max` 0, `memory.oom.group` 1: the run's
processes go together, as they do at every other end) on the run's own cgroup, where v2's
memory controller reaches the job's folder; else the run cgroup itself where it is a v1
memory cgroup; else a parallel cgroup per run in v1's memory hierarchy
(`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where swap is counted), which
the replica joins at birth beside its run cgroup (`RunCgroup.companions`). All are nested
under this process's own, so an outer limit (the node's) still applies. None usable: the
job runs unlimited, and `MemoryCgroups.create` says why, once.

The limit is written once the run has its first process (`RunCgroup.hold`), or before a
forked child joins: this process never stands in a limited cgroup (`host_spawn`), where an
OOM kill could take the master.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from trainguard.backends.local.cgroups import Hierarchy, JobCgroups, RunCgroup, hierarchies

V2_FILES = ("memory.max", "memory.swap.max", "memory.oom.group")
V1_FILES = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")


def limit_writes(memory_bytes: int, v2: bool, present: Sequence[str]) -> list[tuple[str, str]]:
    """(file, value) to write, in order, to hold a cgroup to `memory_bytes`, of the files
    `present` in it: the limit first (v1's memsw may never be below it), swap after."""
    if memory_bytes <= 0:
        raise ValueError(f"a memory limit must be positive, got {memory_bytes}")
    want = (
        {"memory.max": str(memory_bytes), "memory.swap.max": "0", "memory.oom.group": "1"}
        if v2
        else {f: str(memory_bytes) for f in V1_FILES}
    )
    limit = V2_FILES[0] if v2 else V1_FILES[0]
    if limit not in present:
        raise FileNotFoundError(f"no {limit}")
    return [(name, value) for name, value in want.items() if name in present]


def write_limit(path: Path, memory_bytes: int, v2: bool) -> None:
    """Hold the cgroup at `path` to `memory_bytes`; an OSError says why it could not."""
    present = [f for f in (V2_FILES if v2 else V1_FILES) if (path / f).exists()]
    try:
        writes = limit_writes(memory_bytes, v2, present)
    except FileNotFoundError as exc:
        raise OSError(f"{path}: {exc}") from None
    for name, value in writes:
        if name == "memory.oom.group":  # a kernel before 4.19 lacks it: not needed
            with contextlib.suppress(OSError):
                (path / name).write_text(value)
            continue
        (path / name).write_text(value)


def shown(memory_bytes: int) -> str:
    return f"{memory_bytes / 2**20:g} MiB"


class MemoryCgroups:
    """Where this job's runs get their memory limits: in their own cgroup (`companion`
    None) or in a parallel v1 memory cgroup each (`companion` the folder of them)."""

    def __init__(self, kind: str, v2: bool, companion: JobCgroups | None = None) -> None:
        self.kind = kind
        self.v2 = v2
        self.companion = companion

    @classmethod
    def create(
        cls, jobs: JobCgroups | None, token: str, among: Sequence[Hierarchy] | None = None
    ) -> MemoryCgroups | str:
        """How `jobs`' runs can be held to a memory limit, or why they cannot."""
        if jobs is None:
            return "no cgroup of ours: a replica's resources.memory is not enforced"
        h = jobs.hierarchy
        if h.v2:
            try:
                if "memory" in (jobs.folder / "cgroup.controllers").read_text().split():
                    (jobs.folder / "cgroup.subtree_control").write_text("+memory")
                    return cls("cgroup v2 memory.max", True)
            except OSError:
                pass
        elif h.controller == "memory":
            return cls("cgroup v1 memory.limit_in_bytes", False)
        v1 = [x for x in (hierarchies() if among is None else among) if x.controller == "memory"]
        made = JobCgroups.create(token, among=v1)
        if isinstance(made, JobCgroups):
            return cls("cgroup v1 memory.limit_in_bytes, beside each run's cgroup", False, made)
        return (
            f"no memory controller we may use (v2's is not enabled for {jobs.folder}; {made}): "
            "a replica's resources.memory is not enforced"
        )

    def attach(self, run: RunCgroup, memory_bytes: int) -> None:
        """Make `run` hold itself to `memory_bytes` (`RunCgroup.hold` writes it)."""
        target = run
        if self.companion is not None:
            target = self.companion.new_run()
            run.companions.append(target)
        run.pending_limit = partial(write_limit, target.path, memory_bytes, self.v2)

    @property
    def folder(self) -> Path | None:
        """The parallel folder to sweep if this process dies (None: inside the run's own)."""
        return self.companion.folder if self.companion is not None else None

    async def close(self) -> None:
        if self.companion is not None:
            await self.companion.close()
