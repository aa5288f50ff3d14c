"""The Ray backend (R-RUN-3): each replica on a node of an existing Ray cluster.

Per attempt, one placement group holds a bundle per replica (SPREAD or PACK), and one
`ReplicaHost` actor per bundle runs the replica's command on its node (`placement`);
this module holds the runs on those actors. The master stays
where `trainguard` runs: it pulls each replica's output (long polls) into the same
per-replica log files as locally, and learns exits and signals exactly as locally. An
actor that dies under a running replica means its node was lost: that exit is classified
`node_lost`, and the node is kept out of later attempts.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    NodeCheckOutcome,
    ReplicaExited,
    ReplicaStarted,
    output_events,
)
from trainguard.backends.local.oom import launch_paths
from trainguard.backends.output import RunOutput
from trainguard.backends.ray.calls import CALL_S, bounded, label, node_readings, one_line
from trainguard.backends.ray.placement import Placement
from trainguard.backends.ray.warm import NodeZygotes
from trainguard.classify.classes import Classification, ExitEvidence, FailureClass
from trainguard.classify.machine_parse import tail_storage_readings
from trainguard.classify.readings import MachineReading
from trainguard.hangs.stack_model import ReplicaStacks
from trainguard.spec.engines import RayOptions
from trainguard.spec.models import Resources

_POLL_S = 0.5  # a read waits this long for output on the node before it answers empty

_OnOutput = Callable[["_Run", bool, tuple[str, ...]], None]


class _Run:
    """One run of one replica on its node: the actor that hosts it, and its output."""

    def __init__(
        self,
        launch: Launch,
        actor: Any,
        node: dict[str, str],
        tee: TextIO | None,
        on_output: _OnOutput,
    ) -> None:
        self.launch = launch
        self.actor = actor
        self.node = node
        self.output = RunOutput(
            launch.replica,
            launch.log_path,
            tee,
            partial(on_output, self),
        )
        self.pid = 0
        self.stop_requested = False
        self.exited = False  # on its own: its code is read, its node's readings are not yet
        self.done = asyncio.Event()


class RayBackend:
    def __init__(
        self,
        needs: Mapping[str, Resources],
        options: RayOptions,
        tee: TextIO | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        """`needs`: each replica's resources, in rank order (bundle i is rank i);
        `preload`: what each node's zygote imports (the warm start, as locally)."""
        self._opts = options
        self._tee = tee
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self._runs: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_output_s = 0.0
        self._warm = NodeZygotes(preload)
        self._place = Placement(needs, options, self._warm)

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._warm.notes

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit

    async def channel_host(self) -> str:
        return await self._place.channel_host()

    async def rendezvous(self) -> tuple[str, int]:
        return await self._place.rendezvous()

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        return await self._place.task_addresses(replicas, kept)

    # -------------------------------------------------------------- start

    async def start(self, launches: Sequence[Launch]) -> None:
        launches = self._place.with_layout(launches)  # the node variables of its placement
        await self._warm.plan(self._place.ray, launches, self._place.nodes)
        launches = self._warm.with_hosted_store(launches)
        forked = await asyncio.gather(*(self._start_one(launch) for launch in launches))
        if launches:
            self._warm.started(launches[0].attempt, sum(forked), len(launches))

    async def _start_one(self, launch: Launch) -> bool:
        """Start one replica through its actor; True if it forked from a zygote."""
        actor = self._place.actors[launch.replica]
        node = self._place.nodes[launch.replica]
        run = _Run(launch, actor, node, self._tee, self._on_output)
        zygote = await self._warm.ready(node["node_id"], launch.replica)
        try:
            info = await bounded(
                actor.start.remote(
                    list(launch.argv), launch.env, launch.cwd, zygote, launch_paths(launch)
                ),
                CALL_S,
            )
        except Exception as exc:
            info = {"lost": one_line(exc)}
        if info.get("cold"):
            self._warm.cold(launch.replica, info["cold"])
        if "pid" not in info:
            run.output.close()
            ev = ExitEvidence(
                launch.replica,
                None,
                spawn_error=info.get("error"),
                node_lost=info.get("lost"),
            )
            self._emit(
                ReplicaExited(launch.attempt, launch.replica, launch.restart, None, ev, _now())
            )
            return False
        run.pid = int(info["pid"])
        self._runs[launch.replica] = run
        self._emit(
            ReplicaStarted(
                launch.attempt, launch.replica, launch.restart, run.pid, _now(), node=label(node)
            )
        )
        task = asyncio.create_task(self._pump(run))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return not info.get("cold")

    def _on_output(self, run: _Run, first: bool, segments: tuple[str, ...]) -> None:
        self._last_output_s = _now()
        for ev in output_events(run.launch, first, segments, self._last_output_s):
            self._emit(ev)

    async def _pump(self, run: _Run) -> None:
        """Pull output until the replica exits, or its actor (its node) is gone."""
        lost: str | None = None
        code: int | None = None
        quiet_s = self._opts.node_timeout_s
        while not run.done.is_set():
            try:
                data, code = await asyncio.wait_for(
                    run.actor.read.remote(_POLL_S), _POLL_S + quiet_s
                )
            except TimeoutError:  # a killed node fails the call; a cut-off one never answers
                lost = f"its node answered no call for {quiet_s:g} s (ray.node_timeout_s)"
                break
            except Exception as exc:
                lost = one_line(exc)
                break
            run.output.feed(data)
            if code is not None:
                break
        run.exited = code is not None
        machine: tuple[MachineReading, ...] = ()
        if code and not run.stop_requested:  # a failure: what its node's machine said
            machine = await node_readings(run.actor, label(run.node))
        self._finish(run, code, lost, machine)

    def _finish(
        self,
        run: _Run,
        code: int | None,
        lost: str | None,
        machine: tuple[MachineReading, ...] = (),
    ) -> None:
        """Report the run's end, once (the pump, or a stop that gave up on its node)."""
        if run.done.is_set():
            return
        seen = _now()
        run.output.close()
        la = run.launch
        if self._runs.get(la.replica) is run:
            del self._runs[la.replica]
        run.done.set()
        lost_on = None if lost is None else f"{lost} (node {label(run.node)})"
        tail = run.output.tail.lines()
        if machine:  # storage errors in its last lines, as locally (`probe_exit`'s tail)
            machine = (*machine, *tail_storage_readings(tail))
        if lost is not None:
            self._place.mark_lost()
        self._emit(
            ReplicaExited.of(
                la,
                run.pid,
                seen,
                code,
                stop_requested=run.stop_requested,
                log_tail=tail,
                node_lost=lost_on,
                machine=machine,
            )
        )

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        """When any replica (of `replicas`) last printed anything (0 if none has yet)."""
        if replicas is None:
            return self._last_output_s
        runs = [self._runs[r] for r in replicas if r in self._runs]
        return max((run.output.last_s for run in runs), default=0.0)

    def log_tail(self, replica: str) -> tuple[str, ...]:
        run = self._runs.get(replica)
        return run.output.tail.lines() if run else ()

    # -------------------------------------------------------------- stop

    async def _signal(self, run: _Run, signum: int, stop: bool = False) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run.actor.signal.remote(int(signum), stop), CALL_S)

    async def signal(self, replica: str, signum: int) -> bool:
        run = self._runs.get(replica)
        if run is None or run.done.is_set():
            return False
        await self._signal(run, signum)  # on the replica's own node, through its actor
        return True

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        runs = [self._runs[r] for r in replicas if r in self._runs]
        if not runs:
            return
        for run in runs:  # one that exited on its own is told as it ended, not as stopped
            run.stop_requested = run.stop_requested or not run.exited
        live = [r for r in runs if not r.exited]
        await asyncio.gather(*(self._signal(r, signal.SIGTERM, True) for r in live))
        await asyncio.gather(*(self._signal(r, signal.SIGCONT, True) for r in live))
        waits = [asyncio.ensure_future(r.done.wait()) for r in runs]
        _, pending = await asyncio.wait(waits, timeout=grace_s)
        if pending:
            late = [r for r in live if not r.done.is_set()]
            await asyncio.gather(*(self._signal(r, signal.SIGKILL, True) for r in late))
            _, pending = await asyncio.wait(pending, timeout=CALL_S)
            for run in late:  # no answer even to SIGKILL: its node is as good as gone
                self._finish(run, None, "its node did not answer a stop")

    async def close(self) -> None:
        await self.stop(list(self._runs), grace_s=5.0)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        await self._place.shutdown()

    # -------------------------------------------------------------- diagnosis

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        if c.failure_class is not FailureClass.NODE_LOST:
            return None
        why = self._place.exclude_node_of(replica)
        return None if why is None else f"{why}: excluded from later attempts"

    async def check_nodes(self, reason: str) -> NodeCheckOutcome:
        return await self._place.check_nodes(reason)

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        """py-spy runs on each replica's own node, through its actor, all in parallel."""

        async def one(name: str, rank: int, pid: int) -> ReplicaStacks:
            actor = self._place.actors.get(name)
            files = {k: str(v) for k, v in faulthandler_files.items() if k == name}
            try:
                if actor is None:
                    raise RuntimeError("no actor for this replica")
                out = await asyncio.wait_for(
                    actor.dump_stacks.remote([(name, rank, pid)], timeout_s, files), timeout_s + 5
                )
                return ReplicaStacks.from_dict(out[0])
            except Exception as exc:
                why = f"stack dump through Ray failed: {one_line(exc)}"
                return ReplicaStacks(name, rank, pid, "none", False, why, 0.0, ())

        return list(await asyncio.gather(*(one(n, r, p) for n, r, p in targets)))


def _now() -> float:
    return time.time()
