"""Diagnosis before the kill (R-HANG-4): every replica's stack, grouped, culprit named."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainguard.hangs.stack_dumps import dump_stacks
from trainguard.hangs.stack_model import ReplicaStacks, StackReport
from trainguard.hangs.stacks import aggregate
from trainguard.hangs.stragglers import straggler_report

_IMPORT = "importlib._bootstrap"  # py-spy's and faulthandler's name for import machinery

DUMP_TIMEOUT_S = 10.0
"""A stack dump that takes longer is given up: recovery must not wait on diagnosis."""


@dataclass(frozen=True)
class Diagnosis:
    report: StackReport
    stacks: tuple[ReplicaStacks, ...]
    duration_ms: float
    culprit: str | None
    where: str  # the culprit's innermost own frame, e.g. "_stall_forever (train.py:73)"

    def importing(self) -> tuple[str, ...]:
        """The replicas whose main thread is inside an import: still starting, not hung."""
        out = []
        for snap in self.stacks:
            main = [t for t in snap.threads if t.thread_name == "MainThread"] or list(snap.threads)
            if any(_IMPORT in f.filename for t in main[:1] for f in t.frames):
                out.append(snap.replica)
        return tuple(out)


def _where(report: StackReport, replica: str | None) -> str:
    for diag in report.replicas:
        if diag.replica == replica:
            for frame in diag.main_stack:
                if not frame.native:
                    return f"{frame.name} ({Path(frame.filename).name}:{frame.line})"
    return ""


StackDumper = Callable[
    [Sequence[tuple[str, int, int]], float, Mapping[str, Path]],
    Awaitable[list[ReplicaStacks]],
]
"""Takes the stacks where the replicas run: the backend's `dump_stacks`."""


async def _local(
    targets: Sequence[tuple[str, int, int]], timeout_s: float, files: Mapping[str, Path]
) -> list[ReplicaStacks]:
    return await dump_stacks(targets, timeout_s=timeout_s, faulthandler_files=files)


async def diagnose(
    targets: Sequence[tuple[str, int, int]],
    beats: Mapping[str, Sequence[tuple[int, float]]],
    faulthandler_files: Mapping[str, Path],
    clock: Callable[[], float] = time.time,
    dumper: StackDumper = _local,
) -> Diagnosis:
    t0 = time.monotonic()
    snaps = await dumper(targets, DUMP_TIMEOUT_S, faulthandler_files)
    pace = straggler_report(beats, clock())
    for snap in snaps:
        if snap.tool.endswith("(process stopped)"):
            pace[snap.replica] = "stuck"  # SIGSTOPped: it cannot be anything else
    report = aggregate(snaps, pace)
    culprit = report.culprits[0] if report.culprits else None
    return Diagnosis(
        report, tuple(snaps), (time.monotonic() - t0) * 1000, culprit, _where(report, culprit)
    )
