"""The warm start on Ray, the master's side: which nodes have a zygote (`node_zygote`), made
when; which launches fork; where rank 0's zygote holds the rendezvous store."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.backends.interface import SERVICE_ENV, Launch
from trainguard.backends.local.preload_plan import resolve
from trainguard.backends.local.warm_start import common_env, mark_hosted
from trainguard.backends.local.zygote import expand
from trainguard.backends.ray.calls import CALL_S, bounded, label, one_line

WARM_WAIT_S = 3 * CALL_S
"""How long a restart waits for its node's zygote to finish importing before it starts cold."""


class NodeZygotes:
    """The warm start on Ray: a `NodeZygote` actor on each node the job has used, made in
    the background at the node's first placement (that attempt starts cold), kept until
    the job ends, so a restart on a surviving node forks from it."""

    def __init__(self, preload: Sequence[str]) -> None:
        self._preload = tuple(preload)
        self._planned = False
        self._modules: list[str] = []
        self._env: dict[str, str] = {}
        self._distributed = False
        self._actors: dict[str, Any] = {}  # node id -> its NodeZygote actor
        self._ready: dict[str, asyncio.Task[None]] = {}
        self._usable: set[str] = set()  # node ids whose zygote has imported
        self._fresh: set[str] = set()  # node ids whose zygote this start made
        self.notes: list[str] = []
        self._said: set[tuple[str, str]] = set()
        self._hosted: set[tuple[str, int]] = set()  # (ip, port) of stores a keeper holds

    async def plan(
        self, ray: Any, launches: Sequence[Launch], nodes: Mapping[str, Mapping[str, str]]
    ) -> None:
        """At the first start, what to import (`auto`: what the program needs); at every
        start, a zygote for each node of the placement that has none."""
        launches = [launch for launch in launches if SERVICE_ENV not in launch.env]
        self._fresh = set()
        if not launches:
            return  # services do not count: the replicas' program decides what to import
        if not self._planned:
            self._planned = True
            first = launches[0]
            self._modules = await asyncio.to_thread(
                resolve, self._preload, first.argv, first.cwd, first.env.get("PATH")
            )
            self._env, self._distributed = common_env(launches), len(launches) > 1
        if not self._modules:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from trainguard.backends.ray.node_zygote import NodeZygote

        for node in {n["node_id"]: n for n in nodes.values()}.values():
            node_id = node["node_id"]
            if node_id in self._actors:
                continue
            actor = (
                ray.remote(NodeZygote)
                .options(
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote()
            )
            self._actors[node_id] = actor
            self._fresh.add(node_id)
            self._ready[node_id] = asyncio.create_task(self._warm_up(node_id, label(node), actor))

    async def _warm_up(self, node_id: str, label: str, actor: Any) -> None:
        try:
            said = await actor.ready.remote(self._modules, self._env, self._distributed)
        except Exception as exc:
            said = {"error": one_line(exc)}
        if "error" in said:
            self.notes.append(f"warm start off on node {label}: {said['error']}")
            return
        self._usable.add(node_id)
        self.notes.append(
            f"warm start on node {label}: {', '.join(self._modules)} imported once in "
            f"{said['import_s']:.2f} s; replicas placed there again fork from it"
        )

    async def store_port(self, node: Mapping[str, str]) -> int | None:
        """A port where the zygote of `node` (rank 0's) holds a fresh rendezvous store."""
        zygote = self.ready_on(node["node_id"])
        if (
            zygote is None
            or not self._distributed
            or "torch.distributed" not in expand(self._modules)
        ):
            return None  # no zygote there yet, or no torch rendezvous to hold
        try:
            port = await bounded(zygote.open_store.remote(node["ip"]), CALL_S)
        except Exception:
            port = None
        if port is None:
            self._say_once("", "rank 0 hosts the rendezvous store: its node's keeper failed")
            return None
        self._hosted.add((node["ip"], int(port)))
        return int(port)

    def with_hosted_store(self, launches: Sequence[Launch]) -> list[Launch]:
        """The launches, each torch one told its store is held (torchrun's agent store)."""
        return mark_hosted(launches, self._hosted)

    def ready_on(self, node_id: str) -> Any:
        """The node's zygote actor if it has imported (else the replica starts cold)."""
        return self._actors[node_id] if node_id in self._usable else None

    async def ready(self, node_id: str, replica: str) -> Any:
        """`ready_on`, once a zygote an earlier start made has finished importing: it began
        before this start, so it is ready no later than a cold start's own imports would
        be (a restart that came sooner than its import, as under load). One this start made
        is not waited for: the node's first attempt starts cold."""
        task = self._ready.get(node_id)
        if task is not None and not task.done() and node_id not in self._fresh:
            try:
                await asyncio.wait_for(asyncio.shield(task), WARM_WAIT_S)
            except TimeoutError:
                self.cold(
                    replica, f"its node's zygote is still importing after {WARM_WAIT_S:.0f} s"
                )
        return self.ready_on(node_id)

    def started(self, attempt: int, forked: int, of: int) -> None:
        if self._modules:
            self.notes.append(
                f"attempt {attempt}: {forked} of {of} replicas forked from their node's zygote"
            )

    def cold(self, replica: str, why: str) -> None:
        self._say_once(replica, f"{replica} starts cold: {why}")

    def _say_once(self, about: str, note: str) -> None:
        if self._modules and (about, note) not in self._said:
            self._said.add((about, note))
            self.notes.append(note)

    async def close(self, ray: Any) -> None:
        for task in self._ready.values():
            task.cancel()
        actors, self._actors = list(self._actors.values()), {}
        self._usable.clear()

        def kill() -> None:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)

        with contextlib.suppress(TimeoutError):
            await bounded(asyncio.to_thread(kill), CALL_S)
