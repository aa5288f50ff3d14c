"""The Ray backend (R-RUN-3): each replica on a node of an existing Ray cluster.

Per attempt, one placement group holds a bundle per replica (SPREAD or PACK), and one
`ReplicaHost` actor per bundle runs the replica's command on its node. The master stays
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

from trainguard.backends.api import (
    BackendEvent,
    Launch,
    NoCapacity,
    ReplicaExited,
    ReplicaStarted,
    output_events,
)
from trainguard.backends.output import RunOutput
from trainguard.backends.ray.calls import CALL_S, bounded, label, one_line
from trainguard.backends.ray.host import ReplicaHost
from trainguard.backends.ray.warm import NodeZygotes
from trainguard.hangs.stack_model import ReplicaSnapshot
from trainguard.policy.classes import Classification, ExitEvidence, FailureClass
from trainguard.spec.engines import RayOptions
from trainguard.spec.models import Resources
from trainguard.spec.sizes import parse_memory

_POLL_S = 0.5  # a read waits this long for output on the node before it answers empty


def bundle_of(res: Resources) -> dict[str, float]:
    """Ray's resource names for one replica (a replica that names no cpus takes one)."""
    out: dict[str, float] = {"CPU": res.cpus if res.cpus is not None else 1.0}
    if res.gpus:
        out["GPU"] = float(res.gpus)
    if res.memory:
        out["memory"] = float(parse_memory(res.memory))
    out.update(res.custom)
    return out


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
        self._needs = dict(needs)
        self._opts = options
        self._tee = tee
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self._pg: Any = None
        self._actors: dict[str, Any] = {}
        self._nodes: dict[str, dict[str, str]] = {}  # replica -> where its actor runs
        self._runs: dict[str, _Run] = {}
        self._excluded: dict[str, str] = {}  # node id -> why it is kept out
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_output_s = 0.0
        self._ray: Any = None
        self._stale = False  # the placement lost a node: the next attempt is placed anew
        self._warm = NodeZygotes(preload)

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._warm.notes

    # -------------------------------------------------------------- connect & place

    def _connect(self) -> Any:
        if self._ray is None:
            import ray

            if not ray.is_initialized():
                kwargs: dict[str, Any] = {
                    "address": self._opts.address,
                    "namespace": "trainguard",
                    "log_to_driver": False,
                    "logging_level": "ERROR",
                }
                if self._opts.driver_ip:
                    kwargs["_node_ip_address"] = self._opts.driver_ip
                ray.init(**kwargs)
            self._ray = ray
        return self._ray

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit

    async def channel_host(self) -> str:
        """The master's address in the cluster (`ray.driver_ip`, else the one Ray found for
        this machine): replicas on other nodes call the SDK channel there."""
        if self._opts.driver_ip:
            return self._opts.driver_ip
        try:
            ray = await asyncio.to_thread(self._connect)
            return str(await asyncio.to_thread(ray.util.get_node_ip_address))
        except Exception:  # no cluster: the first rendezvous says why, as a failed attempt
            return "127.0.0.1"

    async def rendezvous(self) -> tuple[str, int]:
        """A new placement group and actors for the attempt; rank 0's node and a port."""
        ray = await asyncio.to_thread(self._connect)
        again = await self._same_placement()
        if again is not None:
            return again
        await self._release()
        self._stale = False
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = [bundle_of(r) for r in self._needs.values()]
        kwargs: dict[str, Any] = {"strategy": self._opts.placement_strategy.upper()}
        if self._excluded:
            selector = {"ray.io/node-id": f"!in({','.join(self._excluded)})"}
            kwargs["bundle_label_selector"] = [selector] * len(bundles)
        limit = self._opts.placement_timeout_s
        try:
            self._pg = await bounded(asyncio.to_thread(placement_group, bundles, **kwargs), limit)
            await asyncio.wait_for(self._pg.ready(), limit)
        except TimeoutError:
            try:
                free = await bounded(asyncio.to_thread(ray.available_resources), CALL_S)
            except TimeoutError:
                free = {}
            raise NoCapacity(
                f"the Ray cluster could not place {len(bundles)} replica(s) "
                f"({bundles[0]} each) within {self._opts.placement_timeout_s:g} s; "
                f"free now: {_short(free)}"
                + (f"; excluded nodes: {len(self._excluded)}" if self._excluded else "")
            ) from None
        host = ray.remote(ReplicaHost)
        for i, (name, bundle) in enumerate(zip(self._needs, bundles, strict=True)):
            self._actors[name] = host.options(
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
                asyncio.gather(*(a.where.remote() for a in self._actors.values())),
                self._opts.placement_timeout_s,
            )
        except TimeoutError:
            raise NoCapacity(
                f"the Ray cluster placed the replicas but their actors did not start within "
                f"{self._opts.placement_timeout_s:g} s"
            ) from None
        self._nodes = dict(zip(self._actors, wheres, strict=True))
        first = next(iter(self._actors.values()))
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
            ip = self._nodes[name]["ip"]
            old = kept.get(name)
            if old is not None and old.rpartition(":")[0].strip("[]") == ip:
                return old
            port = int(await bounded(self._actors[name].free_port.remote(), CALL_S))
            return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"

        found = await asyncio.gather(*(one(r) for r in replicas))
        return dict(zip(replicas, found, strict=True))

    async def _same_placement(self) -> tuple[str, int] | None:
        """Rank 0's node and a new port where the last attempt's placement still holds
        (no node lost): the same actors host the restart, with no new placement group and
        no new worker processes, and each node's zygote forks at once."""
        if self._pg is None or not self._actors or self._stale:
            return None
        name, first = next(iter(self._actors.items()))
        try:
            port = await self._rank0_port(first, self._nodes[name])
        except Exception:  # rank 0's actor is gone: place anew
            return None
        return self._nodes[name]["ip"], port

    async def _rank0_port(self, actor: Any, node: Mapping[str, str]) -> int:
        """MASTER_PORT on rank 0's node: where its zygote's keeper holds a store already
        listening, if it can; else a free port there (rank 0 hosts the store)."""
        port = await self._warm.store_port(node)
        if port is not None:
            return port
        return int(await bounded(actor.free_port.remote(), CALL_S))

    async def _release(self) -> None:
        """Kill the last attempt's actors (their replicas die with them) and free its group.

        Each call is bounded: a call into a cluster that just lost a node must not hang
        the master (it would wait for capacity forever instead of trying again)."""
        ray = self._ray
        actors, self._actors = list(self._actors.values()), {}
        pg, self._pg = self._pg, None

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

    # -------------------------------------------------------------- start

    async def start(self, launches: Sequence[Launch]) -> None:
        await self._warm.plan(self._ray, launches, self._nodes)
        launches = self._warm.with_hosted_store(launches)
        forked = await asyncio.gather(*(self._start_one(launch) for launch in launches))
        if launches:
            self._warm.started(launches[0].attempt, sum(forked), len(launches))

    async def _start_one(self, launch: Launch) -> bool:
        """Start one replica through its actor; True if it forked from a zygote."""
        actor = self._actors[launch.replica]
        node = self._nodes[launch.replica]
        run = _Run(launch, actor, node, self._tee, self._on_output)
        zygote = self._warm.ready_on(node["node_id"])
        try:
            info = await bounded(
                actor.start.remote(list(launch.argv), launch.env, launch.cwd, zygote), CALL_S
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
        self._finish(run, code, lost)

    def _finish(self, run: _Run, code: int | None, lost: str | None) -> None:
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
        self._stale = self._stale or lost is not None
        self._emit(
            ReplicaExited.of(
                la,
                run.pid,
                seen,
                code,
                stop_requested=run.stop_requested,
                log_tail=run.output.tail.lines(),
                node_lost=lost_on,
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

    async def _signal(self, run: _Run, signum: int) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run.actor.signal.remote(int(signum)), CALL_S)

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
        for run in runs:
            run.stop_requested = True
        await asyncio.gather(*(self._signal(r, signal.SIGTERM) for r in runs))
        await asyncio.gather(*(self._signal(r, signal.SIGCONT) for r in runs))
        waits = [asyncio.ensure_future(r.done.wait()) for r in runs]
        _, pending = await asyncio.wait(waits, timeout=grace_s)
        if pending:
            late = [r for r in runs if not r.done.is_set()]
            await asyncio.gather(*(self._signal(r, signal.SIGKILL) for r in late))
            _, pending = await asyncio.wait(pending, timeout=CALL_S)
            for run in runs:  # no answer even to SIGKILL: its node is as good as gone
                self._finish(run, None, "its node did not answer a stop")

    async def close(self) -> None:
        await self.stop(list(self._runs), grace_s=5.0)
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        if self._ray is not None:
            await self._release()
            await self._warm.close(self._ray)
            await asyncio.to_thread(self._ray.shutdown)
            self._ray = None

    # -------------------------------------------------------------- diagnosis

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        if c.failure_class is not FailureClass.NODE_LOST:
            return None
        node = self._nodes.get(replica)
        if node is None or node["node_id"] in self._excluded:
            return None
        why = f"node {label(node)} was lost under {replica}"
        self._excluded[node["node_id"]] = why
        self._stale = True
        return f"{why}: excluded from later attempts"

    async def snapshot(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaSnapshot]:
        """py-spy runs on each replica's own node, through its actor, all in parallel."""

        async def one(name: str, rank: int, pid: int) -> ReplicaSnapshot:
            actor = self._actors.get(name)
            files = {k: str(v) for k, v in faulthandler_files.items() if k == name}
            try:
                if actor is None:
                    raise RuntimeError("no actor for this replica")
                out = await asyncio.wait_for(
                    actor.snapshot.remote([(name, rank, pid)], timeout_s, files), timeout_s + 5
                )
                return ReplicaSnapshot.from_dict(out[0])
            except Exception as exc:
                why = f"snapshot through Ray failed: {one_line(exc)}"
                return ReplicaSnapshot(name, rank, pid, "none", False, why, 0.0, ())

        return list(await asyncio.gather(*(one(n, r, p) for n, r, p in targets)))


def _now() -> float:
    return time.time()


def _short(free: Mapping[str, float]) -> str:
    keep = {k: v for k, v in free.items() if not k.startswith(("node:", "bundle_group"))}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(keep.items())) or "nothing"
