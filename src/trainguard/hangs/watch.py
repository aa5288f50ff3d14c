"""Hang detection (R-HANG-1..3): a timer on the job's last sign of life, not a poll.

A sign of life is a line of output from any replica or a heartbeat from the SDK. The
watch sets a timer (`trainguard.timers`) for `last sign of life + interval`; when it is
due, the watch either sees newer activity and sets it again, or reports a hang. The
interval is the job's `job_hang_interval_s`, or what training code set with
`hang_detect(seconds)` for the scope it is in: the shortest active scope wins, and any
replica inside `hang_detect(-1)` switches detection off for the job while it is there.
A change that may shorten the wait (an attempt armed, a scope entered or left, a replica's
first sign of life) sets the timer again at once.

Each replica is watched from its first sign of life. Until every replica has shown one
(importing torch takes seconds on a fresh machine, loading data can take minutes), the
start-up allowance applies instead: `startup_timeout_s`, never shorter than the interval,
counted from the attempt's start. When it runs out with no replica having shown any sign
of life, the report is a start-up hang.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

from trainguard.timers import LOOP_TIMERS, Timer, Timers

OFF = -1.0
_DUE_S = 1e-6
"""A silence this short of its interval counts as the interval: timers fire at their time
give or take the clock's rounding, and waiting for a rounding error would never end."""


@dataclass(frozen=True)
class HangDetected:
    kind: Literal["hang", "exit_hang", "startup_hang"]
    attempt: int
    interval_s: float
    idle_s: float  # how long the job had shown no sign of life (or waited at exit)
    replica: str | None = None  # exit hang: the replica that finished first
    group: int | None = None  # a replica group's watch (torchft): that group is silent


class HangWatch:
    def __init__(
        self,
        *,
        enabled: bool,
        interval_s: float,
        post: Callable[[HangDetected], None],
        output_activity: Callable[[], float],
        clock: Callable[[], float] = time.time,
        startup_timeout_s: float = 600.0,
        timers: Timers = LOOP_TIMERS,
    ) -> None:
        """`timers` runs the watch's timer, on the same time as `clock`."""
        self._enabled = enabled
        self._default = interval_s
        self._startup_s = startup_timeout_s
        self._pending: set[str] = set()  # replicas with no sign of life yet this attempt
        self._seen: set[str] = set()  # signs of life before `arm`, in the attempt starting
        self._expected = 0
        self._post = post
        self._output_activity = output_activity
        self._clock = clock
        self._scopes: dict[str, float] = {}
        self._beats: dict[str, list[tuple[int, float]]] = {}
        self._last_beat_s = 0.0
        self._since_s = clock()
        self._attempt = -1
        self._armed = False
        self._later = timers.later
        self._timer: Timer | None = None  # when the job's silence is next looked at

    # ------------------------------------------------------------ what the master tells it

    def arm(self, attempt: int, replicas: Collection[str] = ()) -> None:
        """A new attempt is running: count from now; `replicas` have yet to show life."""
        self._attempt, self._armed = attempt, True
        self._since_s = self._clock()
        self._pending = set(replicas) - self._seen  # some spoke before all had started
        self._expected = len(set(replicas))
        self._seen.clear()
        self._scopes.clear()
        self._beats.clear()
        self._look()

    def alive(self, replica: str) -> None:
        """A replica's first sign of life (a line of output, an SDK call). It shortens the
        wait only when it was the last one awaited (the start-up allowance then ends):
        before that, the timer stands, and when it fires it looks again from the newest
        activity (1,024 ranks' first lines, or a stop's exits, set it once, not 1,024 times)."""
        if replica in self._pending:
            self._pending.discard(replica)
            if not self._pending:
                self._look()
        elif not self._armed:
            self._seen.add(replica)

    def starting(self, replica: str) -> None:
        """A replica restarted alone: it is in start-up again, from now."""
        self._seen.discard(replica)
        self._pending.add(replica)
        self._since_s = max(self._since_s, self._clock())
        self._look()

    def pending(self) -> frozenset[str]:
        """The replicas that have shown no sign of life yet in this attempt."""
        return frozenset(self._pending)

    def startup_allowance(self) -> float:
        """How long a replica may take to show a sign of life: never under the interval."""
        return max(self._startup_s, self._default)

    def startup_left(self) -> float:
        """Seconds of start-up allowance left while some replica is still starting, else 0."""
        if not self._pending:
            return 0.0
        return max(0.0, self._since_s + self.startup_allowance() - self._clock())

    def rearm(self) -> None:
        """A hang report turned out stale (the job moved again): keep watching."""
        self._armed = True
        self._look()

    def disarm(self) -> None:
        """Not watching (a new attempt is starting, or the job is stopping)."""
        self._armed = False
        self._seen.clear()
        self._look()

    def beat(self, replica: str, step: int | None) -> None:
        self.alive(replica)
        now = self._clock()
        self._last_beat_s = now
        if step is not None:
            history = self._beats.setdefault(replica, [])
            if not history or history[-1][0] != step:
                history.append((step, now))
                del history[:-50]

    def scope(self, replica: str, seconds: float | None) -> None:
        self.alive(replica)
        self._last_beat_s = self._clock()  # any word from a replica is a sign of life
        if seconds is None:
            self._scopes.pop(replica, None)
        else:
            self._scopes[replica] = float(seconds)
        self._look()

    def beats(self) -> dict[str, list[tuple[int, float]]]:
        return {k: list(v) for k, v in self._beats.items()}

    def step_of(self, replica: str) -> int | None:
        """The last step this replica reported in the attempt (None: none reported)."""
        history = self._beats.get(replica)
        return history[-1][0] if history else None

    # ------------------------------------------------------------ the rule

    def interval(self) -> float | None:
        """The interval in force now, or None when detection is off."""
        scopes = list(self._scopes.values())
        if any(s == OFF for s in scopes):
            return None
        if scopes:
            return min(scopes)
        return self._default if self._enabled else None

    def last_activity(self) -> float:
        return max(self._since_s, self._last_beat_s, self._output_activity())

    # ------------------------------------------------------------ the timer

    def _look(self) -> None:
        """Something changed, or the timer is due: report a hang if the silence has lasted
        the interval (and any start-up allowance), else set the timer for when it would."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        interval = self.interval() if self._armed else None
        if interval is None:
            return  # not watching: what changes next looks again
        idle = self._clock() - self.last_activity()
        wait = max(interval - idle, self.startup_left())
        if wait > _DUE_S:
            self._timer = self._later(wait, self._look)
            return
        self._armed = False  # one report per attempt; the master re-arms it
        if self._pending and len(self._pending) == self._expected:
            # not one replica showed a sign of life: the allowance is what ran out
            allowance = self.startup_allowance()
            self._post(HangDetected("startup_hang", self._attempt, allowance, idle))
        else:
            self._post(HangDetected("hang", self._attempt, interval, idle))
