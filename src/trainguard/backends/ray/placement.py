"""Where an attempt's replicas run on a Ray cluster: one placement group, one actor each.

Apart from the runs (`backend`): this holds the cluster connection, the placement group
and its `ReplicaHost` actors, the nodes kept out after a loss, and the rendezvous address;
the runs only use the actors it placed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from trainguard.backends.interface import Launch, NoCapacity, NodeCheckOutcome
from trainguard.backends.launched import Launched
from trainguard.backends.ray.calls import CALL_S, bounded, label
from trainguard.backends.ray.host import NODE_DEVICES_ENV, ReplicaHost
from trainguard.backends.ray.node_check import alive_nodes, check_cluster
from trainguard.backends.ray.warm import NodeZygotes
from trainguard.frameworks.node_env import DEVICES, OWN_DEVICES, placed_envs
from trainguard.spec.engines import RayOptions
from trainguard.spec.models import Resources
from trainguard.spec.sizes import parse_memory


def bundle_of(res: Resources) -> dict[str, float]:
    """Ray's resource names for one replica (a replica that names no cpus takes one)."""
    out: dict[str, float] = {"CPU": res.cpus if res.cpus is not None else 1.0}
    if res.gpus:
        out["GPU"] = float(res.gpus)
    if res.memory:
        out["memory"] = float(parse_memory(res.memory))
    out.update(res.custom)
    return out


def connect(opts: RayOptions) -> Any:
    """The `ray` module, connected to the cluster `opts` names (once per process)."""
    import ray

    if not ray.is_initialized():
        kwargs: dict[str, Any] = {
            "address": opts.address,
            "namespace": "trainguard",
            "log_to_driver": False,
            "logging_level": "ERROR",
        }
        if opts.driver_ip:
            kwargs["_node_ip_address"] = opts.driver_ip
        ray.init(**kwargs)
    return ray


async def channel_host(opts: RayOptions, connected: Callable[[], Any]) -> str:
    """The master's address in the cluster (`ray.driver_ip`, else the one Ray found for
    this machine): replicas and agents on other nodes dial it."""
    if opts.driver_ip:
        return opts.driver_ip
    try:
        ray = await asyncio.to_thread(connected)
        return str(await asyncio.to_thread(ray.util.get_node_ip_address))
    except Exception:  # no cluster: the first rendezvous says why, as a failed attempt
        return "127.0.0.1"


async def place_group(
    ray: Any, bundles: list[dict[str, float]], opts: RayOptions, excluded: Collection[str]
) -> Any:
    """A ready placement group of `bundles`, on no `excluded` node; NoCapacity, with what
    the cluster has free, when it is not ready within `ray.placement_timeout_s`."""
    from ray.util.placement_group import placement_group

    kwargs: dict[str, Any] = {"strategy": opts.placement_strategy.upper()}
    if excluded:
        selector = {"ray.io/node-id": f"!in({','.join(excluded)})"}
        kwargs["bundle_label_selector"] = [selector] * len(bundles)
    limit = opts.placement_timeout_s
    pg = None
    try:
        pg = await bounded(asyncio.to_thread(placement_group, bundles, **kwargs), limit)
        await asyncio.wait_for(pg.ready(), limit)
    except TimeoutError:
        # Not left pending: placed later (a node back), it would hold the CPUs the next
        # try needs.
        await release(ray, [], pg)
        try:
            free = await bounded(asyncio.to_thread(ray.available_resources), CALL_S)
        except TimeoutError:
            free = {}
        raise NoCapacity(
            f"the Ray cluster could not place {len(bundles)} replica(s) "
            f"({bundles[0]} each) within {limit:g} s; free now: {_short(free)}"
            + (f"; excluded nodes: {len(excluded)}" if excluded else "")
        ) from None
    return pg


async def release(ray: Any, actors: Sequence[Any], pg: Any) -> None:
    """Kill `actors` and free the placement group `pg` (None: none). Each call is bounded:
    a call into a cluster that just lost a node must not hang the master (it would wait
    for capacity forever instead of trying again)."""

    def release() -> None:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        if pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(pg)

    with contextlib.suppress(TimeoutError):
        await bounded(asyncio.to_thread(release), CALL_S)


def with_node_env(
    launched: Mapping[str, Launch],
    nodes: Mapping[str, Mapping[str, str]],
    launches: Sequence[Launch],
) -> list[Launch]:
    """`launches` with what the placement gives their environment: torchrun's node
    variables from which ranks of the attempt (`launched`) share a node, and each node's
    GPUs (what Ray gave its ranks' actors) for every rank of it."""
    node_ids = {r: n["node_id"] for r, n in nodes.items()}
    gpus = {r: tuple(g for g in n.get("gpus", "").split(",") if g) for r, n in nodes.items()}
    ranks = {r: (la.rank, la.env) for r, la in launched.items()}
    changes = placed_envs(ranks, node_ids, gpus)
    out = []
    for la in launches:
        env = {**la.env, **changes.get(la.replica, {})}
        env.pop(OWN_DEVICES, None)  # Ray's ids place them here, not the master's
        if DEVICES in changes.get(la.replica, {}):
            env[NODE_DEVICES_ENV] = env[DEVICES]  # the actor sets it, over Ray's own ids
        out.append(replace(la, env=env))
    return out


def exclude_node_of(
    replica: str, nodes: Mapping[str, Mapping[str, str]], excluded: dict[str, str]
) -> str | None:
    """Keep the node `replica` was lost on (`nodes`: replica -> its node) in `excluded`;
    why, or None if it already is (or the replica was never placed)."""
    node = nodes.get(replica)
    if node is None or node["node_id"] in excluded:
        return None
    why = f"node {label(node)} was lost under {replica}"
    excluded[node["node_id"]] = why
    return why


async def check_nodes(
    connected: Callable[[], Any],
    excluded: Collection[str],
    placed: Mapping[str, Mapping[str, str]],
    reason: str,
) -> tuple[NodeCheckOutcome, dict[str, str]]:
    """The node check on every alive node not `excluded` (`ray.node_check`), and the nodes
    to keep out, while as many nodes as the last placement (`placed`) used are left."""
    try:
        ray = await asyncio.to_thread(connected)
        alive = await bounded(asyncio.to_thread(alive_nodes, ray), CALL_S)
        nodes = {i: a for i, a in alive.items() if i not in excluded}
        need = len({n["node_id"] for n in placed.values()}) or 1
        return await check_cluster(ray, nodes, need, reason)
    except Exception as exc:  # no cluster, a call that failed: the retry goes on
        return NodeCheckOutcome(f"node check after {reason} could not run: {exc}", ran=False), {}


class Placement:
    """The placement group and actors of the current attempt, kept while no node is lost."""

    def __init__(
        self, needs: Mapping[str, Resources], options: RayOptions, warm: NodeZygotes
    ) -> None:
        """`needs`: each replica's resources, in rank order (bundle i is rank i)."""
        self._needs = dict(needs)
        self._opts = options
        self._warm = warm
        self._pg: Any = None
        self.actors: dict[str, Any] = {}
        self.nodes: dict[str, dict[str, str]] = {}  # replica -> where its actor runs
        self._excluded: dict[str, str] = {}  # node id -> why it is kept out
        self.ray: Any = None  # the connected `ray` module; None until `connect`
        self._stale = False  # a node was lost: the next attempt is placed anew
        self._launched = Launched()

    def connect(self) -> Any:
        if self.ray is None:
            self.ray = connect(self._opts)
        return self.ray

    async def channel_host(self) -> str:
        return await channel_host(self._opts, self.connect)

    async def rendezvous(self) -> tuple[str, int]:
        """A new placement group and actors for the attempt; rank 0's node and a port."""
        ray = await asyncio.to_thread(self.connect)
        again = await self._same_placement()
        if again is not None:
            return again
        await self.release()
        self._stale = False
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = [bundle_of(r) for r in self._needs.values()]
        self._pg = await place_group(ray, bundles, self._opts, self._excluded)
        host = ray.remote(ReplicaHost)
        for i, (name, bundle) in enumerate(zip(self._needs, bundles, strict=True)):
            self.actors[name] = host.options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                memory=bundle.get("memory"),
                resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory")},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=i
                ),
                max_concurrency=4,  # a read may wait while a stop signals
            ).remote()
        try:  # placed is not yet running: an actor that cannot start must not hang the master
            wheres = await asyncio.wait_for(
                asyncio.gather(*(a.where.remote() for a in self.actors.values())),
                self._opts.placement_timeout_s,
            )
        except TimeoutError:
            raise NoCapacity(
                f"the Ray cluster placed the replicas but their actors did not start within "
                f"{self._opts.placement_timeout_s:g} s"
            ) from None
        self.nodes = dict(zip(self.actors, wheres, strict=True))
        first = next(iter(self.actors.values()))
        try:
            port = await self._rank0_port(first, wheres[0])
        except TimeoutError:
            raise NoCapacity("rank 0's actor did not answer within 10 s") from None
        return wheres[0]["ip"], port

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        """On the node each replica's actor was placed on: its address, a port free there
        (a kept address stays while the replica's node is the same)."""

        async def one(name: str) -> str:
            ip = self.nodes[name]["ip"]
            old = kept.get(name)
            if old is not None and old.rpartition(":")[0].strip("[]") == ip:
                return old
            port = int(await bounded(self.actors[name].free_port.remote(), CALL_S))
            return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

        found = await asyncio.gather(*(one(r) for r in replicas))
        return dict(zip(replicas, found, strict=True))

    def with_layout(self, launches: Sequence[Launch]) -> list[Launch]:
        """The launches with what the placement gives their environment: torchrun's node
        variables from which ranks share a node, and each node's GPUs (what Ray gave its
        ranks' actors) for every rank of it, so `cuda:LOCAL_RANK` is the rank's own."""
        return with_node_env(self._launched.add(launches), self.nodes, launches)

    def exclude_node_of(self, replica: str) -> str | None:
        """Keep the node `replica` was lost on out of later attempts; why, or None if it
        already is (or the replica was never placed)."""
        why = exclude_node_of(replica, self.nodes, self._excluded)
        self._stale = self._stale or why is not None
        return why

    async def check_nodes(self, reason: str) -> NodeCheckOutcome:
        """The node check on every alive node not yet kept out (`ray.node_check`); a bad
        node is kept out of the next placement while as many nodes as the last one used
        are left."""
        found, out = await check_nodes(self.connect, self._excluded, self.nodes, reason)
        self._excluded.update(out)
        self._stale = self._stale or bool(out)
        return found

    def mark_lost(self) -> None:
        """A replica's node stopped answering: the next attempt is placed anew, not on
        the same actors (the node itself is kept out only once the loss is classified)."""
        self._stale = True

    async def shutdown(self) -> None:
        """Free the placement, the nodes' zygotes and the cluster connection (at close)."""
        ray = self.ray
        if ray is None:
            return
        await self.release()
        await self._warm.close(ray)
        await asyncio.to_thread(ray.shutdown)
        self.ray = None

    async def _same_placement(self) -> tuple[str, int] | None:
        """Rank 0's node and a new port where the last attempt's placement still holds
        (no node lost): the same actors host the restart, with no new placement group and
        no new worker processes, and each node's zygote forks at once."""
        if self._pg is None or not self.actors or self._stale:
            return None
        name, first = next(iter(self.actors.items()))
        try:
            port = await self._rank0_port(first, self.nodes[name])
        except Exception:  # rank 0's actor is gone: place anew
            return None
        return self.nodes[name]["ip"], port

    async def _rank0_port(self, actor: Any, node: Mapping[str, str]) -> int:
        """MASTER_PORT on rank 0's node: where its zygote's keeper holds a store already
        listening, if it can; else a free port there (rank 0 hosts the store)."""
        port = await self._warm.store_port(node)
        if port is not None:
            return port
        return int(await bounded(actor.free_port.remote(), CALL_S))

    async def release(self) -> None:
        """Kill the last attempt's actors (their replicas die with them) and free its group."""
        actors, self.actors = list(self.actors.values()), {}
        pg, self._pg = self._pg, None
        await release(self.ray, actors, pg)


def _short(free: Mapping[str, float]) -> str:
    keep = {k: v for k, v in free.items() if not k.startswith(("node:", "bundle_group"))}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(keep.items())) or "nothing"
