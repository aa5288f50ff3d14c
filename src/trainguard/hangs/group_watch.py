"""Hang detection per replica group (torchft): a silent group is a hung group, even while
the other groups train and print. With no groups it is the job's watch alone.

The job's own watch stays what it is (job-wide; off in async mode, as AIMaster's); each
group gets a watch of its own over its members' output and SDK calls, on whenever the
job's hang detection is. What names a replica reaches the job's watch and its group's;
a group's watch reports `HangDetected` with its group.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from trainguard.hangs.watch import HangDetected, HangWatch
from trainguard.timers import LOOP_TIMERS, Timers


def _tagged(post: Callable[[HangDetected], None], group: int, ev: HangDetected) -> None:
    post(replace(ev, group=group))


class GroupedHangWatch(HangWatch):
    def __init__(
        self,
        *,
        groups: Sequence[Sequence[str]],
        group_output: Callable[[Collection[str]], float],
        groups_enabled: bool,
        interval_s: float,
        post: Callable[[HangDetected], None],
        output_activity: Callable[[], float],
        clock: Callable[[], float],
        startup_timeout_s: float,
        enabled: bool = False,
        timers: Timers = LOOP_TIMERS,
    ) -> None:
        super().__init__(
            enabled=enabled,
            interval_s=interval_s,
            post=post,
            output_activity=output_activity,
            clock=clock,
            startup_timeout_s=startup_timeout_s,
            timers=timers,
        )
        self.members = [tuple(m) for m in groups]
        self.watches = [
            HangWatch(
                enabled=groups_enabled,
                interval_s=interval_s,
                post=functools.partial(_tagged, post, g),
                output_activity=functools.partial(group_output, members),
                clock=clock,
                startup_timeout_s=startup_timeout_s,
                timers=timers,
            )
            for g, members in enumerate(self.members)
        ]
        self._group_of = {name: g for g, m in enumerate(self.members) for name in m}

    def group(self, g: int) -> HangWatch:
        return self.watches[g]

    def _of(self, replica: str) -> HangWatch | None:
        g = self._group_of.get(replica)
        return None if g is None else self.watches[g]

    def arm(self, attempt: int, replicas: Collection[str] = ()) -> None:
        super().arm(attempt, replicas)
        live = set(replicas)
        for members, watch in zip(self.members, self.watches, strict=True):
            watch.arm(attempt, [m for m in members if m in live])

    def disarm(self) -> None:
        super().disarm()
        for watch in self.watches:
            watch.disarm()

    def alive(self, replica: str) -> None:
        super().alive(replica)
        if (watch := self._of(replica)) is not None:
            watch.alive(replica)

    def starting(self, replica: str) -> None:
        super().starting(replica)
        if (watch := self._of(replica)) is not None:
            watch.starting(replica)

    def beat(self, replica: str, step: int | None) -> None:
        super().beat(replica, step)
        if (watch := self._of(replica)) is not None:
            watch.beat(replica, step)

    def scope(self, replica: str, seconds: float | None) -> None:
        super().scope(replica, seconds)
        if (watch := self._of(replica)) is not None:
            watch.scope(replica, seconds)
