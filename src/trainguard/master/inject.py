"""Fault injection at run time: fires each `--inject` (parsed by `trainguard.spec.injection`)
once, when its attempt reaches its time or step. A fault due while its replica is between
two runs (being restarted) lands when the replica runs again: a fault is never lost to
the timing of an earlier one."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Callable

from trainguard.spec.injection import Injection
from trainguard.timers import LOOP_TIMERS, Timer, Timers


def kill_this_master() -> None:
    """`--inject master@...`: the master dies as a crash would kill it (then `resume`)."""
    os.kill(os.getpid(), signal.SIGKILL)


class FaultInjector:
    """Fires each injection once, when its attempt reaches its time or step."""

    def __init__(
        self,
        injections: list[Injection],
        fire: Callable[[Injection], bool],
        timers: Timers = LOOP_TIMERS,
    ) -> None:
        """`fire(inj)` returns False when the replica is between runs: it waits for the next."""
        self._pending = list(injections)
        self._waiting: list[Injection] = []  # due, for a replica between two runs
        self._fire = fire
        self._attempt = -1
        self._later = timers.later
        self._timers: list[Timer] = []

    def arm(self, attempt: int) -> None:
        """The attempt is running: start the clocks of its timed injections."""
        self.disarm()
        self._attempt = attempt
        for inj in self._pending:
            if inj.attempt == attempt and inj.after_s is not None:
                self._timers.append(self._later(inj.after_s, functools.partial(self._once, inj)))

    def disarm(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers = []
        self._attempt = -1

    def on_step(self, replica: str | None, step: int) -> None:
        """`replica` reached `step` (None: the job did, as its output showed: every
        replica's injection at that step is due)."""
        for inj in list(self._pending):
            due = inj.at_step is not None and step >= inj.at_step
            mine = replica is None or inj.replica in (None, replica)
            if due and mine and inj.attempt == self._attempt:
                self._once(inj)

    def on_started(self, replica: str) -> None:
        """`replica` runs again: the faults that came due meanwhile land now."""
        for inj in [i for i in self._waiting if i.replica == replica]:
            if inj.attempt == self._attempt and self._fire(inj):
                self._waiting.remove(inj)

    def _once(self, inj: Injection) -> None:
        if inj in self._pending:
            self._pending.remove(inj)
            if not self._fire(inj):
                self._waiting.append(inj)
