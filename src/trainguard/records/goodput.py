"""Goodput (issue 5): how much of a job's wall time trained, and where the rest went.

Pure: from the job's rows (attempts, restart records, progress steps), with times in
seconds. Productive time is, per attempt, first to last reported step, less the time spent
redoing steps an earlier attempt had already reached. The rest is badput:

  startup         attempt start -> its first reported step
  detection       last step before a failure -> the decision
  hang waiting    the same for a hang or an exit hang: the whole wait for the detector
  restart         stop + schedule + start of the new attempt (restart record phases)
  work lost       steps redone after a restart (since the last checkpoint)
  queueing        waiting in the server's queue (QUEUED, from the transitions)
  other           what is left: the end of the job, time without reports, ...

The advice is Young's interval, sqrt(2 x checkpoint cost x mean time between failures),
from this job's own median commit time and failure history.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from typing import Any

from trainguard.records.rows import AttemptRow, JobRow, ProgressRow, RestartRow, TransitionRow


def goodput(
    job: JobRow,
    attempts: Sequence[AttemptRow],
    restarts: Sequence[RestartRow],
    steps: Sequence[ProgressRow],
    now_s: float,
    transitions: Sequence[TransitionRow] = (),
) -> dict[str, Any]:
    end = job.ended_at_s or now_s
    total = max(0.0, end - job.created_at_s)
    by_attempt: dict[int, list[ProgressRow]] = {}
    for row in steps:
        by_attempt.setdefault(row.attempt, []).append(row)
    productive = startup = lost = 0.0
    reached = -1  # the highest step any earlier attempt reported
    for a in attempts:
        rows = sorted(by_attempt.get(a.number, []), key=lambda r: r.at_s)
        if not rows:
            continue
        startup += max(0.0, rows[0].at_s - a.started_at_s)
        span = rows[-1].at_s - rows[0].at_s
        redo_end = next((r.at_s for r in rows if r.step > reached), rows[-1].at_s)
        redone = max(0.0, redo_end - rows[0].at_s) if reached >= 0 else 0.0
        lost += redone
        productive += max(0.0, span - redone)
        reached = max(reached, max(r.step for r in rows))
    detection = hang_waiting = 0.0
    for r in restarts:
        before = [s.at_s for s in steps if s.at_s <= r.at_s]
        if before:
            waited = max(0.0, r.at_s - max(before))
            if r.failure_class in ("hang", "exit_hang"):
                hang_waiting += waited
            else:
                detection += waited
    restart = sum(
        ((r.stop_ms or 0) + (r.schedule_ms or 0) + (r.start_ms or 0)) / 1000 for r in restarts
    )
    badput = {
        "startup_s": startup,
        "detection_s": detection,
        "hang_waiting_s": hang_waiting,
        "restart_s": restart,
        "work_lost_s": lost,
        "queueing_s": _time_in(transitions, "QUEUED", end),
    }
    badput["other_s"] = max(0.0, total - productive - sum(badput.values()))
    costs = [s.commit_ms / 1000 for s in steps if s.commit_ms is not None]
    ckpt_times = sorted(s.at_s for s in steps if s.checkpoint)
    return {
        "total_s": total,
        "productive_s": productive,
        "goodput": productive / total if total else 0.0,
        "badput": badput,
        "failures": len(restarts),
        "advice": _advice(costs, ckpt_times, total, len(restarts)),
    }


def _time_in(transitions: Sequence[TransitionRow], state: str, end_s: float) -> float:
    """Seconds spent in `state`, from each transition into it to the next transition."""
    total = 0.0
    for here, after in itertools.zip_longest(transitions, transitions[1:]):
        if here.to_state == state:
            total += max(0.0, (after.at_s if after else end_s) - here.at_s)
    return total


def _advice(costs: list[float], times: list[float], total: float, failures: int) -> dict[str, Any]:
    cost = statistics.median(costs) if costs else None
    gaps = [b - a for a, b in itertools.pairwise(times)]
    interval = statistics.median(gaps) if gaps else None
    mtbf = total / failures if failures else None
    young = math.sqrt(2 * cost * mtbf) if cost is not None and mtbf is not None else None
    if young is None:
        why = "no failures yet" if mtbf is None else "no checkpoint commit was measured"
        text = f"no advice: {why}"
    else:
        text = (
            f"checkpoint every {young:.3g} s (Young: sqrt(2 x {cost:.3g} s cost x {mtbf:.3g} s "
            f"between failures))"
            + (f"; now every {interval:.3g} s" if interval is not None else "")
        )
    return {
        "checkpoint_cost_s": cost,
        "checkpoint_interval_s": interval,
        "mtbf_s": mtbf,
        "young_interval_s": young,
        "text": text,
    }
