"""Evidence of the kernel's OOM killer: the `oom_kill` counters of our memory cgroups.

A replica killed by SIGKILL while this counter rose was most likely killed for memory.
cgroup v2 keeps it in `memory.events` (with `oom_group_kill`, a whole group killed at
once), v1 in `memory.oom_control`; where neither can be read the counter stays 0, no exit
is called an OOM on this evidence, and the reading says the source is absent.

Two counters: the one of the cgroup this master lives in (the machine's or container's
limit: it also counts other processes' kills, so it is not sure of the replica), and the
run's own where its cgroup is a memory cgroup (`cgroups.RunCgroup`: sure of the replica).
`exit_readings` adds the rest of the machine's evidence (`backends.machine_probe`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.backends.local.cgroups import RunCgroup
from trainguard.backends.local.memory_limit import V1_FILES, V2_FILES, shown
from trainguard.backends.machine_probe import probe_exit
from trainguard.classify.readings import Finding, MachineReading, Source
from trainguard.storage.env import ENV_CHECKPOINT_DIR

if TYPE_CHECKING:
    from trainguard.backends.interface import Launch
    from trainguard.backends.local.run import Run
    from trainguard.backends.local.tracking import RunProcesses

_ROOT = Path("/sys/fs/cgroup")
_FILES = ("memory.events", "memory.oom_control")  # v2, v1
_KEYS = ("oom_kill", "oom_group_kill")


def _candidates() -> list[Path]:
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    out: list[Path] = []
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            out += [_ROOT / rel / "memory.events", _ROOT / "memory.events"]
        elif "memory" in controllers.split(","):
            out += [
                _ROOT / "memory" / rel / "memory.oom_control",
                _ROOT / "memory/memory.oom_control",
            ]
    return out


def _find() -> Path | None:
    for path in _candidates():
        if path.is_file():
            return path
    return None


_FILE = _find()


def oom_counts(path: Path) -> dict[str, int] | None:
    """`oom_kill` and `oom_group_kill` of a memory.events / memory.oom_control file (a key
    it lacks is 0); None when it cannot be read."""
    try:
        text = path.read_text()
    except OSError:
        return None
    out = dict.fromkeys(_KEYS, 0)
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key in out:
            with contextlib.suppress(ValueError):
                out[key] = int(value)
    return out


def oom_kill_count() -> int:
    if _FILE is None:
        return 0
    counts = oom_counts(_FILE)
    return sum(counts.values()) if counts else 0


def counter_of(processes: RunProcesses) -> Path | None:
    """The memory counter of `processes`' own memory cgroup, where they have one."""
    if not isinstance(processes, RunCgroup):
        return None
    folder = processes.memory_path
    for name in _FILES:
        if folder is not None and (folder / name).is_file():
            return folder / name
    return None


def own_limit(counter: Path) -> int | None:
    """The memory limit of the cgroup of `counter`, as read (None: none, or unreadable)."""
    for name in V2_FILES[:1] + V1_FILES[:1]:
        with contextlib.suppress(OSError, ValueError):
            limit = int((counter.parent / name).read_text())
            return limit if limit < 2**62 else None  # v1's "no limit" is a huge number
    return None  # v2's "max" too


def memory_reading(run: Run) -> MachineReading:
    """What the memory cgroups counted while the run lived (read at its exit, before its
    cgroup goes): its own counter, sure; else ours, which counts others' kills too."""
    return cgroup_reading(run.processes, run.oom_before)


def cgroup_reading(processes: RunProcesses, oom_before: int) -> MachineReading:
    """`memory_reading` of a run's `processes` (also on a Ray node, by its host actor);
    `oom_before`: our cgroup's counter when the run began."""
    own = counter_of(processes)
    counts = oom_counts(own) if own is not None else None
    if own is not None and counts is not None:
        kills = sum(counts.values())
        value = f"{own}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
        limit = own_limit(own)
        held = "" if limit is None else f", held to its resources.memory of {shown(limit)}"
        if limit is not None:
            value += f"; limit {limit} bytes"
        if kills:
            return MachineReading(
                Source.CGROUP,
                value,
                f"the kernel's OOM killer killed a process of the replica's own cgroup{held}",
                True,
                Finding.OOM_KILL,
                str(own.parent),
            )
        return MachineReading(Source.CGROUP, value, "no OOM kill in its own cgroup", True)
    if _FILE is None:
        return MachineReading(
            Source.CGROUP, "no memory cgroup counter readable", "absent", False, Finding.ABSENT
        )
    after = oom_kill_count()
    value = f"{_FILE}: oom_kill {oom_before} -> {after}"
    if after > oom_before:
        return MachineReading(
            Source.CGROUP,
            value,
            "an OOM kill in the memory cgroup it shares while it ran (its or another process's)",
            False,
            Finding.OOM_KILL,
            str(_FILE.parent),
        )
    return MachineReading(Source.CGROUP, value, "no OOM kill while it ran", True)


def run_paths(run: Run) -> list[str]:
    """The job's paths a failed run may have filled: its log's folder, the checkpoints'."""
    return launch_paths(run.launch)


def launch_paths(launch: Launch) -> list[str]:
    """`run_paths` of a launch (a Ray node's host probes them as that node sees them)."""
    paths = [str(launch.log_path.parent)]
    ckpt = launch.env.get(ENV_CHECKPOINT_DIR)
    if ckpt and "://" not in ckpt:
        paths.append(ckpt)
    return paths


async def exit_readings(
    run: Run, memory: MachineReading, tail: tuple[str, ...]
) -> tuple[MachineReading, ...]:
    """What the machine says about a run that failed: `memory` (read before its cgroup
    went), the kernel log about its pid or cgroup since it started, its paths, the GPUs."""
    return await probe_exit(
        pids={run.pid} if run.pid else set(),
        since_us=run.started_us,
        paths=run_paths(run),
        tail=tail,
        cgroup=kernel_cgroup(run.processes),
        extra=(memory,),
    )


def kernel_cgroup(processes: RunProcesses) -> str | None:
    """How the kernel log names the run's memory cgroup (the last two parts of its path)."""
    if not isinstance(processes, RunCgroup):
        return None
    return "/".join((processes.memory_path or processes.path).parts[-2:])
