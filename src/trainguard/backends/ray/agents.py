"""The Ray backend with node agents (`ray.agents`, issue 40): one agent per node, not one
actor per rank.

Per attempt, one placement group still holds a bundle per replica (SPREAD or PACK): Ray
reserves each rank's resources and says which node each bundle is on. No actor uses the
bundles. On each node the job uses, one `AgentHost` actor (no CPU, pinned to the node,
kept for the whole job) starts that node's agent (`backends.agent.node`), which dials the
master's `AgentBackend` and forks the node's ranks from its warm zygote, as on Slurm. The
node's processes are then its ranks, one agent and one Ray worker, whatever the ranks per
node; a node whose agent goes silent for `AGENT_SILENT_S` is lost, whatever its ranks
were doing (a host cut off stays "alive" to Ray for ~30 s), and kept out of later
placements. A restart with no node lost keeps the placement group, and forks at once.
The nodes need not see the master's files: the master writes each replica's log from what
its agent sends (the agent keeps a copy in the node's temporary folder).

Each bundle's GPU ids are read by a short task placed in it: a node's ranks see their
node's GPUs, in local-rank order, as with an actor per rank."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from trainguard.backends.agent.backend import AgentBackend
from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    NoCapacity,
    NodeCheckOutcome,
    ReplicaExited,
)
from trainguard.backends.launched import Launched
from trainguard.backends.ray.agent_host import AgentHost, gpu_ids_here
from trainguard.backends.ray.calls import CALL_S, bounded, label, one_line
from trainguard.backends.ray.node_check import alive_nodes
from trainguard.backends.ray.placement import (
    bundle_of,
    channel_host,
    check_nodes,
    connect,
    exclude_node_of,
    place_group,
    release,
    with_node_env,
)
from trainguard.classify.classes import Classification, FailureClass
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.spec.engines import RayOptions
from trainguard.spec.models import Resources

CLOSE_S = 10.0
"""How long the agents are given to stop their ranks and exit at the job's end, before
their actors are killed (and the guardians take what is left)."""


async def _ended(hosts: Sequence[Any], within_s: float) -> None:
    """Until every agent of `hosts` has exited (or `within_s`, or its actor is gone)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within_s
    while hosts and loop.time() < until:
        try:
            codes = await bounded(asyncio.gather(*(h.ended.remote() for h in hosts)), CALL_S)
        except Exception:
            return
        if all(c is not None for c in codes):
            return
        await asyncio.sleep(0.1)


class RayAgents:
    def __init__(
        self,
        needs: Mapping[str, Resources],
        options: RayOptions,
        tee: TextIO | None = None,
        preload: Sequence[str] = (),
        job: str = "",
    ) -> None:
        """`needs`: each replica's resources, in rank order (bundle i is rank i);
        `preload`: what each agent's zygote imports; `job`: trainguard's job id."""
        self._needs = dict(needs)
        self._opts = options
        token = secrets.token_hex(16)
        self._agents = AgentBackend(job or "job", token, "", preload, tee, keep_logs=True)
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self.ray: Any = None
        self._pg: Any = None
        self._stale = False  # a node was lost: the next attempt is placed anew
        self.nodes: dict[str, dict[str, str]] = {}  # replica -> its bundle's node
        self._hosts: dict[str, Any] = {}  # node id -> its agent's actor
        self._excluded: dict[str, str] = {}  # node id -> why it is kept out
        self._launched = Launched()
        self._master: str | None = None  # where the agents dial (HOST:PORT)

    # -------------------------------------------------------------- placement

    def _connect(self) -> Any:
        if self.ray is None:
            self.ray = connect(self._opts)
        return self.ray

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._agents.warm_start_notes

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit
        self._agents.bind(self._from_agents)

    def _from_agents(self, ev: BackendEvent) -> None:
        if isinstance(ev, ReplicaExited) and ev.evidence.node_lost:
            self._stale = True  # the next attempt is placed anew, not on a lost node
        self._emit(ev)

    async def channel_host(self) -> str:
        return await channel_host(self._opts, self._connect)

    async def rendezvous(self) -> tuple[str, int]:
        """The attempt's placement (the last one, while no node was lost) with an agent on
        each of its nodes; rank 0's node and a port free there."""
        ray = await asyncio.to_thread(self._connect)
        if self._pg is None or self._stale or not self.nodes:
            await self._place(ray)
        first = next(iter(self._needs))
        return self.nodes[first]["ip"], await self._free_port(first)

    async def _place(self, ray: Any) -> None:
        await release(ray, [], self._pg)
        self._pg, self._stale = None, False
        bundles = [bundle_of(r) for r in self._needs.values()]
        self._pg = await place_group(ray, bundles, self._opts, self._excluded)
        table = await bounded(asyncio.to_thread(ray.util.placement_group_table, self._pg), CALL_S)
        alive = await bounded(asyncio.to_thread(alive_nodes, ray), CALL_S)
        on = {int(i): str(n) for i, n in table["bundles_to_node_id"].items()}
        gpus = await self._gpu_ids(ray, bundles)
        self.nodes = {
            name: {"node_id": on[i], "ip": alive.get(on[i], "?"), "gpus": gpus.get(name, "")}
            for i, name in enumerate(self._needs)
        }
        await self._join(ray, {n["node_id"]: n for n in self.nodes.values()})

    async def _gpu_ids(self, ray: Any, bundles: Sequence[Mapping[str, float]]) -> dict[str, str]:
        """replica -> the GPU ids Ray reserved in its bundle, read by a task of no CPU placed
        there (no actor holds the bundles): each node's ranks get their node's GPUs, in
        local-rank order, as with an actor per rank."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probe = ray.remote(gpu_ids_here)
        asks = {
            name: probe.options(
                num_cpus=0,
                num_gpus=bundle["GPU"],
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=i
                ),
            ).remote()
            for i, (name, bundle) in enumerate(zip(self._needs, bundles, strict=True))
            if bundle.get("GPU")
        }
        if not asks:
            return {}
        ids = await bounded(asyncio.gather(*asks.values()), self._opts.placement_timeout_s)
        return {name: str(i) for name, i in zip(asks, ids, strict=True)}

    async def _join(self, ray: Any, nodes: Mapping[str, Mapping[str, str]]) -> None:
        """An agent on each of `nodes` (node id -> node) that has none connected; a node
        whose agent does not join within `ray.agent_join_s` is kept out, and the attempt
        is placed again (NoCapacity: retried, or waited for, as the spec says)."""
        agents = self._agents
        if self._master is None:
            host, port = await agents.listen(await self.channel_host())
            self._master = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        missing = {i: n for i, n in nodes.items() if label(n) not in agents.live()}
        if not missing:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(AgentHost)
        said: dict[str, str] = {}
        for node_id in missing:
            old = self._hosts.pop(node_id, None)
            if old is not None:
                await release(ray, [old], None)
            self._hosts[node_id] = remote.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote()

        async def start(node_id: str, node: Mapping[str, str]) -> None:
            try:
                await bounded(
                    self._hosts[node_id].start.remote(
                        self._master, agents.job, label(node), agents.token, {}
                    ),
                    self._opts.agent_join_s,
                )
            except Exception as exc:
                said[node_id] = one_line(exc)

        await asyncio.gather(*(start(i, n) for i, n in missing.items()))
        names = {label(n): i for i, n in missing.items()}
        joined = await agents.wait_for_nodes(names, self._opts.agent_join_s)
        late = {i: said.get(i, "") for name, i in names.items() if name not in joined}
        if late:
            for node_id, why in late.items():
                self._excluded[node_id] = f"its agent did not join: {why or 'no word'}"
            self._stale = True
            wait = self._opts.agent_join_s
            raise NoCapacity(
                "; ".join(
                    f"node {label(missing[i])}'s agent did not join in {wait:g} s"
                    + (f": {why}" if why else "")
                    for i, why in late.items()
                )
            )

    async def _free_port(self, replica: str) -> int:
        host = self._hosts[self.nodes[replica]["node_id"]]
        return int(await bounded(host.free_port.remote(), CALL_S))

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        """On each replica's node: its address, a port free there (a kept address stays
        while the replica's node is the same)."""

        async def one(name: str) -> str:
            ip = self.nodes[name]["ip"]
            old = kept.get(name)
            if old is not None and old.rpartition(":")[0].strip("[]") == ip:
                return old
            port = await self._free_port(name)
            return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

        found = await asyncio.gather(*(one(r) for r in replicas))
        return dict(zip(replicas, found, strict=True))

    # -------------------------------------------------------------- runs

    async def start(self, launches: Sequence[Launch]) -> None:
        """Each launch to the agent of its bundle's node, with the node variables of its
        placement (which ranks share a node)."""
        runs = with_node_env(self._launched.add(launches), self.nodes, launches)
        where = {la.replica: label(self.nodes[la.replica]) for la in launches}
        await self._agents.start_on(runs, where)

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        await self._agents.stop(replicas, grace_s)

    async def signal(self, replica: str, signum: int) -> bool:
        return await self._agents.signal(replica, signum)

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        return self._agents.last_output_s(replicas)

    def log_tail(self, replica: str) -> tuple[str, ...]:
        return self._agents.log_tail(replica)

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        """Each node's agent takes its replicas' stacks there, all nodes at once."""
        return await self._agents.dump_stacks(targets, timeout_s, faulthandler_files)

    # -------------------------------------------------------------- nodes

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        if c.failure_class is not FailureClass.NODE_LOST:
            return None
        why = exclude_node_of(replica, self.nodes, self._excluded)
        if why is None:
            return None
        self._stale = True
        return f"{why}: excluded from later attempts"

    async def check_nodes(self, reason: str) -> NodeCheckOutcome:
        found, out = await check_nodes(self._connect, self._excluded, self.nodes, reason)
        self._excluded.update(out)
        self._stale = self._stale or bool(out)
        return found

    async def close(self) -> None:
        """The agents are told to close (each stops its ranks first); then their actors and
        the placement group go, and the connection to the cluster."""
        await self._agents.close()
        ray = self.ray
        if ray is None:
            return
        hosts, self._hosts = list(self._hosts.values()), {}
        await _ended(hosts, CLOSE_S)  # each agent's own stop of its ranks, before the kill
        await release(ray, hosts, self._pg)
        self._pg = None
        await asyncio.to_thread(ray.shutdown)
        self.ray = None
