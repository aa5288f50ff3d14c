"""Reading a Ray node's machine when its replica fails (R-EVID-1), on the node itself: the
host actor is the only process that sees the replica's cgroup, pid and kernel log there.

The same probes as locally (`backends.machine_probe.probe_exit`, `backends.local.oom`):
the run's memory counter is read at once (before its cgroup goes), the rest in a thread of
its own, so neither the read that found the exit nor a stop waits for a slow nvidia-smi or
a hung mount. The master asks for the readings (`ReplicaHost.machine`) as JSON.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence

from trainguard.backends.local.oom import cgroup_reading, kernel_cgroup, oom_kill_count
from trainguard.backends.local.tracking import RunProcesses
from trainguard.backends.machine_probe import NVIDIA_SMI_S, monotonic_us, probe_exit
from trainguard.classify.readings import Finding, MachineReading, Source, to_json

PROBE_S = NVIDIA_SMI_S + 3.0
"""The longest the probes may take together (nvidia-smi's limit is the longest)."""


def seen_here(paths: Sequence[str], fallback: str | None) -> list[str]:
    """The job's paths as this node sees them: one it does not see (the master's log
    folder on another machine) is replaced by `fallback` (what this node writes for it)."""
    out = [p for p in paths if os.path.isdir(p)]
    if len(out) < len(paths) and fallback:
        out.append(fallback)
    return out


class ExitProbe:
    """The readings of one run: armed at its start, begun at a failed exit."""

    def __init__(self, paths: Sequence[str] = ()) -> None:
        self.paths = list(paths)
        self.since_us = monotonic_us()  # on the kernel log's clock: its lines since then
        self.oom_before = oom_kill_count()
        self._done = threading.Event()
        self._json: str | None = None
        self._begun = False

    def begin(self, pid: int, processes: RunProcesses | None) -> None:
        """Read the run's memory counter now, the rest in a thread (never holds the caller)."""
        if self._begun:
            return
        self._begun = True
        extra: tuple[MachineReading, ...] = ()
        cgroup = None
        if processes is not None:
            extra = (cgroup_reading(processes, self.oom_before),)
            cgroup = kernel_cgroup(processes)

        def run() -> None:
            try:
                found = asyncio.run(
                    probe_exit(
                        pids={pid},
                        since_us=self.since_us,
                        paths=self.paths,
                        cgroup=cgroup,
                        extra=extra,
                    )
                )
            except Exception as exc:  # a probe's own fault: say so, never guess
                why = f"the node's probes failed: {type(exc).__name__}: {exc}"
                found = (*extra, absent(why))
            self._json = to_json(found)
            self._done.set()

        threading.Thread(target=run, name="trainguard-exit-probe", daemon=True).start()

    def result(self, timeout_s: float) -> str | None:
        """The readings as JSON (`classify.readings.to_json`); None if none were begun."""
        if not self._begun:
            return None
        if not self._done.wait(timeout_s):
            return to_json((absent(f"the node's probes gave no answer in {timeout_s:g} s"),))
        return self._json


def absent(why: str) -> MachineReading:
    """No reading came from the node: the kernel log counts as unread (nothing is guessed)."""
    return MachineReading(Source.KMSG, why, "absent", False, Finding.ABSENT)
