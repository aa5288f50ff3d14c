"""The warm start of a job's replicas (issue 16): whether there is a zygote, what it
imported, and for each launch whether it may fork from it or why it starts cold. The
backend asks; it runs the processes (`backend`), the zygote forks them (`zygote`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace

from trainguard.backends.interface import SERVICE_ENV, Launch
from trainguard.backends.local.preload_plan import AUTO, resolve
from trainguard.backends.local.python_cmd import parse, startup_env_differs
from trainguard.backends.local.rendezvous_keeper import KeeperError, RendezvousKeeper
from trainguard.backends.local.zygote import Zygote, ZygoteError, expand

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""torch's env:// rendezvous: "True" makes every rank a client of a store someone else hosts."""


class WarmStart:
    def __init__(self, preload: Sequence[str]) -> None:
        self._preload = tuple(preload)
        self.zygote: Zygote | None = None
        self.keeper: RendezvousKeeper | None = None  # the rendezvous store's host, if any
        self.notes: list[str] = []  # what the warm start did, why one starts cold (append-only)
        self._cold_said: set[tuple[str, str]] = set()  # (replica, reason) already noted
        self._planned = False  # the zygote was considered (once, at the first start)
        self._hosted: set[tuple[str, int]] = set()  # (host, port) of stores the keeper opened

    async def plan(
        self,
        launches: Sequence[Launch],
        on_exit: Callable[[int, int], None],
        on_death: Callable[[int], None] = lambda _code: None,
    ) -> None:
        """At the first start of replicas (services do not count): start the zygote for
        these launches (`on_exit`: a forked replica's exit; `on_death`: the zygote's own),
        importing what
        `preload` names (`auto`: what the first replica's program needs). Nothing to
        preload is said nowhere: the replicas simply start the ordinary way."""
        launches = [launch for launch in launches if SERVICE_ENV not in launch.env]
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
        common = common_env(launches)
        try:
            self.zygote = await Zygote.start(
                self._preload, common, distributed=_distributed(launches)
            )
        except ZygoteError as exc:
            self.notes.append(f"warm start off: {exc}")
            return
        self.zygote.on_exit = on_exit
        self.zygote.on_death = on_death
        self.notes.append(
            f"warm start: {', '.join(self._preload)} imported once in "
            f"{self.zygote.import_s:.2f} s; replicas fork from it"
        )
        if len(launches) > 1 and "torch.distributed" in expand(self._preload):
            try:
                self.keeper = await self.zygote.keeper()
            except (ZygoteError, KeeperError) as exc:
                self.notes.append(f"rank 0 hosts the rendezvous store: no keeper ({exc})")

    async def store_port(self, host: str) -> int | None:
        """A port where the keeper listens with a new store for the next attempt, or None
        (there is no keeper, or it failed: rank 0 hosts the store, as usual)."""
        if self.keeper is None or not self.keeper.alive:
            return None
        try:
            port = await self.keeper.open(host)
        except KeeperError as exc:
            self.notes.append(f"rank 0 hosts the rendezvous store: the keeper failed ({exc})")
            return None
        self._hosted.add((host, port))
        return port

    async def with_hosted_store(self, launches: Sequence[Launch]) -> list[Launch]:
        """The launches, each torch one told to connect to the keeper's store where the
        keeper holds its endpoint. The first attempt's endpoint was drawn before the zygote
        existed: the keeper opens a store there now (if the port is still free)."""
        endpoints = {e for e in map(torch_endpoint, launches) if e is not None}
        for endpoint in sorted(endpoints - self._hosted):  # once each, not once per rank
            if self.keeper is None:
                break
            try:
                await self.keeper.open(*endpoint)
            except KeeperError as exc:
                self.notes.append(f"rank 0 hosts the rendezvous store: {exc}")
                continue
            self._hosted.add(endpoint)
            self.notes.append(
                "the rendezvous store is held by trainguard, as torchrun's agent holds it: "
                "every rank connects to a store that already listens"
            )
        return mark_hosted(launches, self._hosted)

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
        if self.keeper is not None:
            self.keeper.close()
            self.keeper = None
        if self.zygote is not None:
            await self.zygote.close()
            self.zygote = None


def common_env(launches: Sequence[Launch]) -> dict[str, str]:
    """The variables every launch sets alike: what a zygote imports in for all of them."""
    common = dict(launches[0].env)
    for launch in launches[1:]:
        common = {k: v for k, v in common.items() if launch.env.get(k) == v}
    return common


def mark_hosted(launches: Sequence[Launch], hosted: set[tuple[str, int]]) -> list[Launch]:
    """The launches, each torch one whose store endpoint is in `hosted` told to be a client
    of it (torchrun's agent store)."""
    return [
        replace(launch, env={**launch.env, AGENT_STORE_ENV: "True"})
        if torch_endpoint(launch) in hosted
        else launch
        for launch in launches
    ]


def torch_endpoint(launch: Launch) -> tuple[str, int] | None:
    """(MASTER_ADDR, MASTER_PORT) of a launch the pytorch preset made, else None."""
    env = launch.env
    if "TORCHELASTIC_RUN_ID" not in env or "MASTER_ADDR" not in env:
        return None
    try:
        return env["MASTER_ADDR"], int(env.get("MASTER_PORT", ""))
    except ValueError:
        return None


def _distributed(launches: Sequence[Launch]) -> bool:
    """Ranks of a job of several: here, or elsewhere (one rank on each of several nodes)."""
    world = launches[0].env.get("WORLD_SIZE", "1")
    return len(launches) > 1 or (world.isdigit() and int(world) > 1)
