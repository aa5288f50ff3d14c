"""Which replica fell behind? Judged from heartbeats alone, for when stacks cannot tell: each
replica's pace ("stuck", "slow", "ok"). (A job's *progress* is its training steps and
metrics, as the SDK reports them or its output shows them; this is not that.)

Pure: the heartbeat history and the time are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from statistics import median

STUCK_FACTOR = 2.0
"""Silent for longer than this many of the others' typical step times: stuck."""
SLOW_FACTOR = 2.0
"""A median step time this many times the others' typical one: slow."""
STUCK_STEPS = 2
"""The others advanced this many steps while a replica did not: stuck."""


def straggler_report(
    beats: Mapping[str, Sequence[tuple[int, float]]], now_s: float
) -> dict[str, str]:
    """Each replica with heartbeats -> "stuck", "slow" or "ok".

    `beats` holds each replica's (step, time_s) heartbeats in time order. A replica
    *advances* at the first beat of a higher step; its step time is the time between
    advances divided by the steps gained, and its median over the history is its pace.
    The others' typical step time is the median of the other replicas' paces.

    - stuck: its last step is behind the others' highest, and either it last advanced
      more than 2x the others' typical step time ago, or the others gained 2+ steps
      since it last advanced. Beats that repeat a step (a heartbeat thread) do not count
      as progress.
    - slow: not stuck, and its pace is more than 2x the others' typical step time. The
      others' (not all replicas') median is used so that with two replicas one of them
      can still be slow.
    - ok: otherwise, or when there is too little history to judge.

    Replicas without beats are absent from the result.
    """
    advances = {r: _advances(b) for r, b in beats.items() if b}
    paces = {r: p for r, a in advances.items() if (p := _pace(a)) is not None}
    report: dict[str, str] = {}
    for replica, adv in advances.items():
        others = [r for r in advances if r != replica]
        other_paces = [paces[r] for r in others if r in paces]
        typical = median(other_paces) if other_paces else None
        step, since_s = adv[-1]
        leader = max((advances[r][-1][0] for r in others), default=step)
        gained = max((_gained_since(advances[r], since_s) for r in others), default=0)
        silent_long = typical is not None and now_s - since_s > STUCK_FACTOR * typical
        if step < leader and (silent_long or gained >= STUCK_STEPS):
            report[replica] = "stuck"
        elif typical is not None and replica in paces and paces[replica] > SLOW_FACTOR * typical:
            report[replica] = "slow"
        else:
            report[replica] = "ok"
    return report


def _advances(beats: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """(step, time first seen) for each step that moved forward."""
    out: list[tuple[int, float]] = []
    for step, t in sorted(beats, key=lambda b: b[1]):
        if not out or step > out[-1][0]:
            out.append((step, t))
    return out


def _pace(advances: Sequence[tuple[int, float]]) -> float | None:
    times = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in pairwise(advances)]
    return median(times) if times else None


def _gained_since(advances: Sequence[tuple[int, float]], since_s: float) -> int:
    """Steps this replica gained after `since_s`."""
    before = [s for s, t in advances if t <= since_s]
    base = before[-1] if before else advances[0][0]
    return advances[-1][0] - base
