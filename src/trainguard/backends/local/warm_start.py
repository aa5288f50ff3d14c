"""The warm start of a job's replicas (issue 16): whether there is a zygote, what it
imported, and for each launch whether it may fork from it or why it starts cold. The
backend asks; it runs the processes (`backend`), the zygote forks them (`zygote`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from trainguard.backends.api import Launch
from trainguard.backends.local.preload_plan import AUTO, resolve
from trainguard.backends.local.python_cmd import parse, startup_env_differs
from trainguard.backends.local.zygote import Zygote, ZygoteError


class WarmStart:
    def __init__(self, preload: Sequence[str]) -> None:
        self._preload = tuple(preload)
        self.zygote: Zygote | None = None
        self.notes: list[str] = []  # what the warm start did, why one starts cold (append-only)
        self._cold_said: set[tuple[str, str]] = set()  # (replica, reason) already noted
        self._planned = False  # the zygote was considered (once, at the first start)

    async def plan(self, launches: Sequence[Launch], on_exit: Callable[[int, int], None]) -> None:
        """At the first start only: start the zygote for these launches, importing what
        `preload` names (`auto`: what the first replica's program needs). Nothing to
        preload is said nowhere: the replicas simply start the ordinary way."""
        if self._planned or not launches:
            return
        self._planned = True
        first = launches[0]
        if AUTO in self._preload:
            self._preload = tuple(
                await asyncio.to_thread(
                    resolve, self._preload, first.argv, first.cwd, first.env.get("PATH")
                )
            )
        if not self._preload:
            return
        common = dict(first.env)
        for launch in launches[1:]:
            common = {k: v for k, v in common.items() if launch.env.get(k) == v}
        try:
            self.zygote = await Zygote.start(self._preload, common, distributed=len(launches) > 1)
        except ZygoteError as exc:
            self.notes.append(f"warm start off: {exc}")
            return
        self.zygote.on_exit = on_exit
        self.notes.append(
            f"warm start: {', '.join(self._preload)} imported once in "
            f"{self.zygote.import_s:.2f} s; replicas fork from it"
        )

    def why_cold(self, launch: Launch) -> str | None:
        """Why this replica cannot fork from the zygote, or None when it can; noted (once
        per replica and reason) where there is a zygote to say it of."""
        if self.zygote is None:
            return "no preload process"
        why = self._why_not(self.zygote, launch)
        if why is not None and (launch.replica, why) not in self._cold_said:
            self._cold_said.add((launch.replica, why))
            self.notes.append(f"{launch.replica} starts cold: {why}")
        return why

    @staticmethod
    def _why_not(zygote: Zygote, launch: Launch) -> str | None:
        if not zygote.alive:
            return "the preload process is gone"
        cmd = parse(launch.argv, launch.env.get("PATH"))
        if isinstance(cmd, str):
            return cmd
        return startup_env_differs(zygote.env, launch.env)

    async def close(self) -> None:
        if self.zygote is not None:
            await self.zygote.close()
            self.zygote = None
