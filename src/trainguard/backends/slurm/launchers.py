"""How a Slurm job's ranks reach the nodes the backend placed them on: each as its own
`srun` step, supervised here (`StepLauncher`), or forked by one agent per node
(`AgentLauncher`, `slurm.agents`, issue 40). Placement, the nodes' health and exclusion
are the Slurm backend's: a launcher reads its tables (`where` each replica runs, the nodes
`excluded`), starts, stops, signals and takes stacks of what was placed there, and its
`supervisor` says what ran: output, tails, runs and exits."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TextIO

from trainguard.backends.agent.backend import AgentBackend
from trainguard.backends.interface import BackendEvent, Launch, ReplicaExited
from trainguard.backends.local.backend import LocalBackend
from trainguard.backends.net import address_towards
from trainguard.backends.slurm import cluster, steps
from trainguard.backends.slurm.agent_steps import AgentSteps
from trainguard.backends.slurm.cluster import Allocation, Node, SlurmError
from trainguard.backends.slurm.node_probe import ended_on_its_own
from trainguard.backends.slurm.placement import srun_argv
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.spec.engines import SlurmOptions
from trainguard.storage.env import ENV_JOB_ID

Layout = Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]]
"""replica -> (its environment, its Slurm task variables), by `placement.layout_env`."""

_PROBE = os.environ.get("TRAINGUARD_SLURM_NODE_PROBE", "1") != "0"


class Supervisor(Protocol):
    """What the Slurm backend reads from whatever supervises the ranks."""

    @property
    def warm_start_notes(self) -> Sequence[str]: ...

    def bind(self, emit: Callable[[BackendEvent], None]) -> None: ...

    def last_output_s(self, replicas: Collection[str] | None = None) -> float: ...

    def log_tail(self, replica: str) -> tuple[str, ...]: ...

    def current_run(self, replica: str) -> tuple[int, int, int | None] | None: ...


class Launcher(Protocol):
    supervisor: Supervisor

    async def join(
        self, alloc: Allocation, nodes: Mapping[str, Node], usable: Sequence[str]
    ) -> dict[str, str]:
        """Ready to start on `usable`: the nodes that are not, each with why."""
        ...

    async def start(self, launches: Sequence[Launch], layout: Layout) -> None:
        """Each launch on its node in `where`."""
        ...

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None: ...

    async def signal(self, replica: str, signum: int) -> bool: ...

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]: ...

    def settled(self, ev: ReplicaExited) -> ReplicaExited:
        """The exit with the status its program ended with, where the launcher knows it."""
        ...

    def hung_up(self, replica: str) -> bool:
        """Whether the replica was lost with its node's agent ending its connection (its
        step ended: scancel, a requeue, the time limit; or its machine died), not by the
        agent's silence."""
        ...

    async def close(self) -> None: ...


class StepLauncher:
    """One srun step of one task per replica; the srun processes run here, beside the
    master, so the local backend supervises them."""

    def __init__(
        self,
        opts: SlurmOptions,
        tee: TextIO | None,
        where: Mapping[str, str],
        excluded: Collection[str],
    ) -> None:
        self._local = LocalBackend(tee=tee, preload=())
        self.supervisor: Supervisor = self._local
        self._opts, self._where, self._excluded = opts, where, excluded
        self._alloc: Allocation | None = None
        self._ended: dict[str, int] = {}  # replica -> its program's status, said before a stop
        self._job_ids: dict[str, str] = {}  # replica -> trainguard's job id (its env)

    async def join(
        self, alloc: Allocation, nodes: Mapping[str, Node], usable: Sequence[str]
    ) -> dict[str, str]:
        self._alloc = alloc
        return {}

    async def start(self, launches: Sequence[Launch], layout: Layout) -> None:
        alloc = self._alloc
        assert alloc is not None, "join() comes first"
        runs = []
        for la in launches:
            self._job_ids[la.replica] = la.env.get(ENV_JOB_ID, "")
            env, task_env = layout[la.replica]
            node, extra = self._where[la.replica], self._opts.srun_args
            argv = srun_argv(
                la, node, alloc.job_id, list(self._excluded), extra, task_env, probe=_PROBE
            )
            runs.append(replace(la, argv=tuple(argv), env={**la.env, **env}))
        await self._local.start(runs)

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        ended = {r: ended_on_its_own(self._local.log_tail(r)) for r in replicas}
        self._ended.update({r: code for r, code in ended.items() if code is not None})
        await self._local.stop(replicas, grace_s, list(self._ended))
        if self._alloc is not None:
            await steps.cancel(self._alloc.job_id, replicas)

    async def signal(self, replica: str, signum: int) -> bool:
        """`scancel --signal` of its step: the remote task itself, as a fault would hit it."""
        alloc = self._alloc
        if alloc is None or (step := (await steps.of_job(alloc.job_id)).get(replica)) is None:
            return False
        try:
            await cluster.run_slurm(["scancel", f"--signal={signum}", f"{alloc.job_id}.{step}"])
        except SlurmError:
            return False
        return True

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        """py-spy on each replica's own node, through a step beside its own, all at once."""
        alloc = self._alloc
        running = await steps.of_job(alloc.job_id) if alloc is not None else {}

        async def one(name: str, rank: int, pid: int) -> ReplicaStacks:
            node, job_id = self._where.get(name), self._job_ids.get(name)
            if node is None or alloc is None or job_id is None:
                return ReplicaStacks(name, rank, pid, "none", False, "not placed", 0.0, ())
            step = (alloc.job_id, running[name]) if name in running else None
            return await steps.stacks(
                alloc.job_id, node, job_id, (name, rank, pid), timeout_s, step
            )

        return list(await asyncio.gather(*(one(*t) for t in targets)))

    def settled(self, ev: ReplicaExited) -> ReplicaExited:
        """Its program had failed when the stop came; the stop's KILL may have ended its
        wrapper while it read the node: the status is the one the wrapper said."""
        code = self._ended.pop(ev.replica, None)
        if code is None or ev.evidence.stop_requested:
            return ev
        return replace(ev, evidence=replace(ev.evidence, returncode=code))

    def hung_up(self, replica: str) -> bool:
        return False  # no agent

    async def close(self) -> None:
        await self._local.close()
        if self._alloc is not None:
            await steps.cancel(self._alloc.job_id, list(self._where))


class AgentLauncher:
    """One agent step per node (`agent_steps`), for the whole job; the master talks to the
    agents (`backends.agent`): output, exits with the node's own evidence, stops, signals
    and stacks go over their connections."""

    def __init__(
        self,
        opts: SlurmOptions,
        tee: TextIO | None,
        where: Mapping[str, str],
        job: str,
        preload: Sequence[str],
    ) -> None:
        self._agents = AgentBackend(job, secrets.token_hex(16), "", preload, tee)
        self.supervisor: Supervisor = self._agents
        self._opts, self._where = opts, where
        self._steps: AgentSteps | None = None

    async def join(
        self, alloc: Allocation, nodes: Mapping[str, Node], usable: Sequence[str]
    ) -> dict[str, str]:
        """An agent on each usable node (its step started once, for the whole job; again on
        a node that comes back); a node whose agent does not join within
        `slurm.agent_join_s` is left out, with what its srun said."""
        agents = self._agents
        if self._steps is None:
            host, port = await agents.listen(address_towards(nodes[usable[0]].addr))
            self._steps = AgentSteps(
                alloc.job_id, f"{host}:{port}", agents.job, agents.token, self._opts.srun_args
            )
        missing = [n for n in usable if n not in agents.live()]
        if not missing:
            return {}
        await self._steps.start(missing)
        wait = self._opts.agent_join_s
        joined = await agents.wait_for_nodes(missing, wait)
        return {
            node: f"node {node}'s agent did not join in {wait:g} s: "
            + (self._steps.said(node) or "srun said nothing")
            for node in missing
            if node not in joined
        }

    async def start(self, launches: Sequence[Launch], layout: Layout) -> None:
        """Each launch to its node's agent, with the Slurm task variables of its slot."""
        runs = []
        for la in launches:
            env, task_env = layout[la.replica]
            node = {"SLURMD_NODENAME": self._where[la.replica]}
            runs.append(replace(la, env={**la.env, **env, **task_env, **node}))
        await self._agents.start_on(runs, self._where)

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        await self._agents.stop(replicas, grace_s)

    async def signal(self, replica: str, signum: int) -> bool:
        return await self._agents.signal(replica, signum)

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        return await self._agents.dump_stacks(targets, timeout_s, faulthandler_files)

    def settled(self, ev: ReplicaExited) -> ReplicaExited:
        return ev

    def hung_up(self, replica: str) -> bool:
        node = self._where.get(replica)
        return node is not None and self._agents.hung_up(node)

    async def close(self) -> None:
        await self._agents.close()
        if self._steps is not None:
            await self._steps.close(grace_s=10.0)
