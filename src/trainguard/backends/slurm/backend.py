"""Replicas as job steps of the Slurm allocation trainguard runs in (issue 19).

Each replica is one `srun` step of one task, on the node `placement.place` gives it; the
srun process runs here, beside the master, so its output (the remote task's, streamed back
by Slurm) and its exit status are a local process's, and the local backend supervises it.
What this adds: the allocation's nodes and their health, placement, the rendezvous at the
first node, the SDK channel on the address the nodes reach this host at, and node loss.

A node is lost when its slurmd stops answering a connect (`cluster.probe`): a machine
that died or was cut off does not, long before Slurm marks it DOWN. Whenever a replica
fails, every node of the attempt is probed first: a replica on a node that does not answer
is reported lost (`node_lost`) before the failure that its death caused on the healthy
nodes, and its node is kept out of later attempts (and drained, if the spec allows).
A probe this machine cannot make (out of descriptors) loses no node, and a replica this
machine could not start (EMFILE, EAGAIN) is no node's fault: it is not probed for.
Before a retry after a failure that may be a machine's, `check_nodes` runs the node check
on every usable node (`slurm.node_check`) and excludes the bad ones while a spare is left.
Each task runs under `slurm.node_probe`, which reads its node when the program fails; its
readings come back as marker lines in the log tail, taken out here into the exit's
evidence (`machine`), with the storage errors of the tail (TRAINGUARD_SLURM_NODE_PROBE=0
in the master's environment runs the program bare, as before).

With `slurm.agents` (issue 40) the ranks are not steps: one agent step per node forks
them there (`launchers.AgentLauncher`), and an agent silent for `AGENT_SILENT_S` is a lost
node, whatever its ranks were doing. Placement, the nodes' health and exclusion stay this
module's either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    NoCapacity,
    NodeCheckOutcome,
    ReplicaExited,
    ReplicaStarted,
)
from trainguard.backends.launched import Launched
from trainguard.backends.net import address_towards, port_at
from trainguard.backends.slurm import cluster
from trainguard.backends.slurm.cluster import Allocation, Answer, Node, Probe, SlurmError
from trainguard.backends.slurm.launchers import AgentLauncher, Launcher, StepLauncher
from trainguard.backends.slurm.node_check import check_allocation
from trainguard.backends.slurm.node_probe import with_readings
from trainguard.backends.slurm.placement import layout_env, node_failure, place, step_lost
from trainguard.classify.classes import Classification, ExitEvidence, FailureClass
from trainguard.classify.own_errors import is_own_resource_errno
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.spec.engines import SlurmOptions


class SlurmBackend:
    def __init__(
        self,
        opts: SlurmOptions,
        tee: TextIO | None = None,
        env: Mapping[str, str] | None = None,
        replicas: int = 1,
        on_ended: Callable[[str], None] | None = None,
        job: str = "",
        preload: Sequence[str] = (),
    ) -> None:
        """`replicas`: how many the job has (the nodes it needs, at tasks_per_node);
        `on_ended`: told once, with why, when Slurm ends the allocation under the job
        (the master's cancel: under salloc no signal says so); `job`: trainguard's job id
        (the agents say it); `preload`: what the agents' zygotes import."""
        self._end = cluster.AllocationEnd(on_ended or (lambda _why: None))
        self._opts = opts
        self._need = opts.nodes or -(-replicas // opts.tasks_per_node)
        self._env = env
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self._alloc: Allocation | None = None
        self._nodes: dict[str, Node] = {}
        self._usable: list[str] = []
        self._excluded: dict[str, str] = {}  # node -> why it is kept out
        self._avoid: dict[str, str] = {}  # node -> why: on probation, used only with no spare
        self._where: dict[str, str] = {}  # replica -> the node of its current run
        self._lost: set[tuple[int, str, int]] = set()  # runs reported lost: drop their exit
        self._tasks: set[asyncio.Future[Any]] = set()
        self._reading: set[asyncio.Future[Any]] = set()  # failed exits, their nodes probed
        self._looks: dict[str, asyncio.Future[None]] = {}  # node -> `_agent_gone` under way
        self._launched = Launched()
        self._launcher: Launcher = (
            AgentLauncher(opts, tee, self._where, job or "job", preload)
            if opts.agents
            else StepLauncher(opts, tee, self._where, self._excluded)
        )
        self._runs = self._launcher.supervisor

    # -------------------------------------------------------------- the seam

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._runs.warm_start_notes

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit
        self._runs.bind(self._from_inner)

    async def channel_host(self) -> str:
        """This host's address as the allocation's nodes reach it."""
        await self._refresh()
        first = self._nodes[self._alloc_nodes()[0]]
        return address_towards(first.addr)

    async def rendezvous(self) -> tuple[str, int]:
        """The first usable node (rank 0's), and a fresh port there."""
        await self._refresh()
        if len(self._usable) < self._need:
            raise NoCapacity(
                f"the job needs {self._need} node(s) of {self._opts.tasks_per_node} task(s), "
                f"and the allocation has {len(self._usable)} usable{self._why_excluded()}"
            )
        await self._join()
        addr = self._nodes[self._usable[0]].addr
        return addr, port_at(addr)

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        host = self._nodes[self._usable[0]].addr if self._usable else "127.0.0.1"
        return {r: kept.get(r) or f"{host}:{port_at(host)}" for r in replicas}

    async def start(self, launches: Sequence[Launch]) -> None:
        alloc = self._alloc
        assert alloc is not None, "rendezvous() comes first"
        running = {r: n for r, n in self._where.items() if r not in {la.replica for la in launches}}
        if running:  # some replicas restart alone: the others keep their nodes
            await self._refresh()
            await self._join()
        kept = {la.replica: self._where[la.replica] for la in launches if la.replica in self._where}
        placed = place(
            [(la.replica, la.rank) for la in launches],
            [n for n in self._usable if n not in running.values()] if running else self._usable,
            self._opts.tasks_per_node,
            kept if running else None,
        )
        if isinstance(placed, str):  # a replica restarted alone finds no node
            why = f"{placed}{self._why_excluded()}"
            for la in launches:
                ev = ExitEvidence(la.replica, None, spawn_error=why)
                self._emit(ReplicaExited(la.attempt, la.replica, la.restart, None, ev, _now()))
            return
        launched = self._launched.add(launches)
        self._where.update(placed)
        layout = layout_env(launched, self._where)
        await self._launcher.start(launches, layout)

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        """Stopped, and every failed exit whose node was still being probed told: a
        replica that died on its own a moment before the stop is its peers' root cause,
        and the master settles on the exits it has when this returns."""
        await self._launcher.stop(replicas, grace_s)
        if self._reading:
            await asyncio.wait(list(self._reading))

    async def signal(self, replica: str, signum: int) -> bool:
        """The remote task itself, as a fault would hit it."""
        return await self._launcher.signal(replica, signum)

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        return self._runs.last_output_s(replicas)

    def log_tail(self, replica: str) -> tuple[str, ...]:
        return self._runs.log_tail(replica)

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        """py-spy on each replica's own node, all at once."""
        return await self._launcher.dump_stacks(targets, timeout_s, faulthandler_files)

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        if c.failure_class is not FailureClass.NODE_LOST:
            return None
        node = self._where.get(replica)
        if node is None or node in self._excluded:
            return None
        why = f"node {node} was lost under {replica}"
        self._excluded[node] = why
        if self._opts.drain_lost_nodes:
            task = asyncio.ensure_future(cluster.drain(node, f"trainguard: {why}"))
            self._keep(task)
        return f"{why}: excluded from later attempts (srun --exclude={node})"

    def avoid_nodes(self, avoid: Mapping[str, str], drain: bool) -> None:
        """Nodes on probation (trainguard.master.node_ledger): left out of placement while
        the allocation has enough other nodes; drained first when `drain`."""
        for node, why in avoid.items():
            if node not in self._avoid and drain:
                self._keep(asyncio.ensure_future(cluster.drain(node, f"trainguard: {why}")))
            self._avoid.setdefault(node, why)

    async def check_nodes(self, reason: str) -> NodeCheckOutcome:
        """The node check on every usable node of the allocation (`slurm.node_check`); a
        bad node is excluded like a lost one while the job keeps the nodes it needs."""
        try:
            await self._refresh()
            assert self._alloc is not None
            job, usable = self._alloc.job_id, list(self._usable)
            found, out = await check_allocation(job, self._nodes, usable, self._need, reason)
        except SlurmError as exc:
            return NodeCheckOutcome(f"node check after {reason} could not run: {exc}", ran=False)
        self._excluded.update(out)
        self._usable = [n for n in self._usable if n not in out]
        return found

    async def close(self) -> None:
        await self._launcher.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    # -------------------------------------------------------------- nodes

    def _alloc_nodes(self) -> tuple[str, ...]:
        assert self._alloc is not None
        return self._alloc.nodes

    async def _refresh(self) -> None:
        """The allocation (once), each node's state, and which answer now."""
        if self._alloc is None:
            self._alloc = await cluster.allocation(self._env)
        names = self._alloc.nodes
        self._nodes = await cluster.nodes(names)
        missing = [n for n in names if n not in self._nodes]
        if missing:
            raise SlurmError(f"scontrol knows no node {missing[0]} of the allocation")
        candidates = [n for n in names if n not in self._excluded and self._nodes[n].usable]
        found = await self._probe([self._nodes[n] for n in candidates])
        unknown = [(n, p) for n, p in found.items() if p.answer is Answer.UNKNOWN]
        if unknown:  # an error of this machine (the master's), not of the allocation
            node, p = unknown[0]
            raise SlurmError(f"Slurm node {node}: {p.why}")
        self._usable = [n for n in candidates if found[n].answer is Answer.ALIVE]
        spare = [n for n in self._usable if n not in self._avoid]
        if len(spare) >= self._need:  # nodes on probation only where no spare is left
            self._usable = spare

    async def _join(self) -> None:
        """The launcher ready on every usable node; a node where it is not is kept out."""
        assert self._alloc is not None
        out = await self._launcher.join(self._alloc, self._nodes, self._usable)
        if not out:
            return
        self._excluded.update(out)
        self._usable = [n for n in self._usable if n not in out]
        if len(self._usable) < self._need:
            raise NoCapacity(
                f"the job needs {self._need} node(s) of {self._opts.tasks_per_node} task(s), "
                f"and {len(self._usable)} of the allocation are ready{self._why_excluded()}"
            )

    async def _probe(self, nodes: Sequence[Node]) -> dict[str, Probe]:
        timeout = self._opts.probe_timeout_s
        found = await asyncio.gather(*(cluster.probe(n, timeout) for n in nodes))
        return dict(zip((n.name for n in nodes), found, strict=True))

    def _why_excluded(self) -> str:
        if not self._excluded:
            return ""
        return " (" + "; ".join(self._excluded.values()) + ")"

    # -------------------------------------------------------------- exits

    def _from_inner(self, ev: BackendEvent) -> None:
        if isinstance(ev, ReplicaStarted):
            self._emit(replace(ev, node=self._where.get(ev.replica)))
            return
        if not isinstance(ev, ReplicaExited):
            self._emit(ev)
            return
        if (ev.attempt, ev.replica, ev.restart) in self._lost:
            return  # reported lost already, with its node as the cause
        if ev.evidence.node_lost is not None:  # its agent is gone: no probe needed
            self._keep(asyncio.ensure_future(self._agent_lost(ev)), self._reading)
            return
        ev = with_readings(self._launcher.settled(ev))
        failed = node_failure(ev.evidence.log_tail)
        if failed is not None:  # srun exits 0 when the node under its task dies
            lost = replace(ev.evidence, returncode=None, node_lost=self._lost_text(failed))
            ev = replace(ev, evidence=lost)
        elif ev.evidence.returncode == 0 and step_lost(ev.evidence.log_tail):
            # srun's status for an error of its own (22.05 says 0 here): its node is probed
            ev = replace(ev, evidence=replace(ev.evidence, returncode=1))
        if ev.evidence.stop_requested or ev.evidence.returncode == 0 or _own_fault(ev):
            self._emit(ev)
            return
        self._keep(asyncio.ensure_future(self._failed(ev)), self._reading)

    async def _agent_lost(self, ev: ReplicaExited) -> None:
        """A node's agent is gone: Slurm ending the allocation (scancel, a requeue or the
        time limit end the agents' steps as they signal the master) is told first, as for
        a failure. An agent that hung up on a node whose slurmd still answers had its step
        ended, not its machine: Slurm, which may not say so yet, is asked again a moment
        later (without this a requeue read as two lost nodes failed the job for capacity).
        The node's replicas share one such look (its 32 ranks: one probe, not 32)."""
        node = self._where.get(ev.replica, "")
        look = self._looks.get(node)
        if look is None:
            look = self._looks[node] = asyncio.ensure_future(self._agent_gone(node, ev.replica))
            look.add_done_callback(lambda _f: self._looks.pop(node, None))
        await asyncio.shield(look)
        self._emit(ev)

    async def _agent_gone(self, name: str, replica: str) -> None:
        """`_agent_lost`'s look at Slurm and at the node, once per node."""
        alloc = self._alloc
        if alloc is not None and not await self._end.ended(alloc.job_id):
            node = self._nodes.get(name)
            if node is not None and self._launcher.hung_up(replica):
                found = await self._probe([node])
                if found[node.name].answer is Answer.ALIVE:
                    await asyncio.sleep(STEP_ENDED_S)
                    await self._end.ended(alloc.job_id)

    async def _failed(self, ev: ReplicaExited) -> None:
        """A replica failed: first, whether the allocation itself ended (scancel of an
        salloc, its time limit): then the master is told (a cancel, ahead of this exit,
        which charges nothing); else any replica whose node no longer answers is lost."""
        alloc = self._alloc
        if alloc is not None and await self._end.ended(alloc.job_id):
            self._emit(ev)
            return
        where = dict(self._where)
        nodes = {n: self._nodes[n] for n in set(where.values()) if n in self._nodes}
        found = await self._probe(list(nodes.values()))
        dead = {n for n, p in found.items() if p.answer is Answer.LOST}  # not UNKNOWN
        for replica, node in where.items():
            run = self._runs.current_run(replica)
            if node not in dead or run is None or replica == ev.replica:
                continue
            attempt, restart, pid = run
            self._lost.add((attempt, replica, restart))
            self._emit(self._lost_exit(replica, node, attempt, restart, pid, ev.time_s))
            self._keep(asyncio.ensure_future(self._launcher.stop([replica], grace_s=0)))
        own = where.get(ev.replica)
        if own is not None and own in dead:
            evidence = replace(ev.evidence, node_lost=self._lost_text(own))
            ev = replace(ev, evidence=evidence)
        self._emit(ev)

    def _lost_exit(
        self, replica: str, node: str, attempt: int, restart: int, pid: int | None, seen_s: float
    ) -> ReplicaExited:
        tail = self._runs.log_tail(replica)
        evidence = ExitEvidence(replica, None, log_tail=tail, node_lost=self._lost_text(node))
        return ReplicaExited(attempt, replica, restart, pid, evidence, seen_s - 1e-3)

    def _lost_text(self, node: str) -> str:
        n = self._nodes.get(node)
        where = f"{node} ({n.addr})" if n else node
        return f"Slurm node {where} does not answer: its slurmd is unreachable"

    def _keep(self, task: asyncio.Future[Any], *also: set[asyncio.Future[Any]]) -> None:
        """Held (in `_tasks`, and each of `also`) until it is done."""
        for held in (self._tasks, *also):
            held.add(task)
            task.add_done_callback(held.discard)


STEP_ENDED_S = 1.0
"""How long after an agent's step ended on a live node Slurm is asked again whether the
allocation ended: its state reads RUNNING for a moment after it ends the steps."""


def _own_fault(ev: ReplicaExited) -> bool:
    """This machine could not start the replica's srun (out of descriptors or processes):
    no node is to blame, so none is probed for it."""
    return ev.evidence.returncode is None and is_own_resource_errno(ev.evidence.spawn_errno)


def _now() -> float:
    return time.time()
