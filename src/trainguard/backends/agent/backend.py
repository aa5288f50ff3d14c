"""The master's side of the node agents (issue 40): a `Backend` whose replicas run where
their node's agent runs. It listens for agents (`listen`), welcomes those of its job and
token and refuses the rest (`protocol.refusal`), places each launch on an agent, and turns
what the agents send back into the same events a local run gives.

An agent silent past `AGENT_SILENT_S` (no heartbeat, no event) is a lost node, whatever its
replicas were doing: each replica still running there is reported exited with `node_lost`,
without waiting for a scheduler to notice. The master never reaches into an agent's
processes by pid: it sends orders (start, stop, signal) and waits for their answers.

Where each replica runs is its engine's to say (`start_on`: the Slurm backend places by its
allocation's nodes); `start` alone places round-robin by rank over the agents in the order
they joined. What the agents send is tee'd to the terminal as it comes (the output the
agent's budget lets through, `backends.output`), with the `[replica]` prefix of one
machine."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from trainguard.backends.agent import protocol as wire
from trainguard.backends.agent.logs import MasterLogs
from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.backends.net import free_port
from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.classify.logtail import Tail
from trainguard.hangs.stack_model import ReplicaStacks

AGENT_SILENT_S = 2.5
"""An agent silent this long is a lost node (it beats every `node.BEAT_S`, 0.5 s: five
beats missed). Looked at every `WATCH_S`, so a machine that is gone is found within 3 s."""
BEAT_S = 0.5
WATCH_S = 0.25
ANSWER_S = 30.0
"""How long an order (stop, signal) waits for its agent's answer: past it the agent is lost."""


class _Link:
    """One agent: its node, its connection, the orders it has not answered yet."""

    def __init__(self, node: str, writer: asyncio.StreamWriter) -> None:
        self.node = node
        self.writer = writer
        self.heard_s = time.monotonic()
        self.waiting: dict[int, asyncio.Future[dict[str, Any] | None]] = {}
        self.lost: str | None = None
        self.silent = False  # lost by its silence, not by its connection's end

    def say(self, msg: Mapping[str, Any]) -> None:
        if self.lost is None:
            self.writer.write(wire.encode(msg))


@dataclass
class _Run:
    """A replica's run on an agent's node: where, which attempt, its pid once started."""

    node: str
    attempt: int
    restart: int
    pid: int | None = None


class AgentBackend:
    def __init__(
        self,
        job: str,
        token: str,
        host: str = "127.0.0.1",
        preload: Sequence[str] = (),
        tee: TextIO | None = None,
        keep_logs: bool = False,
    ) -> None:
        """`preload`: what each agent's zygote imports (the warm start, as on one machine):
        told in the welcome, so every node runs what the master decided. `keep_logs`: the
        nodes do not see the master's files (Ray): the master writes each replica's log
        from what its agent sends, and the agent keeps its own copy on the node."""
        self.job, self.token, self._host, self._tee = job, token, host, tee
        self._logs = MasterLogs(job) if keep_logs else None
        self._preload = list(preload)
        self._emit: Callable[[BackendEvent], None] = lambda _ev: None
        self._links: dict[str, _Link] = {}  # node -> its agent, in the order they joined
        self._joined = asyncio.Condition()
        self._runs: dict[str, _Run] = {}  # replica -> its current run
        self._tails: defaultdict[str, Tail] = defaultdict(Tail)
        self._last_output: dict[str, float] = {}
        self._newest_output_s = 0.0
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._notes: list[str] = []  # each agent's warm start notes, as they come
        self._beat_s = 0.0  # when the agents were last told the master is alive
        self._warmed: set[str] = set()  # nodes told to start or to warm (their zygote planned)
        self.refused: list[str] = []  # why each refused agent was refused, in order

    # -------------------------------------------------------------- agents

    async def listen(self, host: str | None = None) -> tuple[str, int]:
        """Where agents connect: `host` (default: the one given at construction), a free
        port."""
        self._host = host or self._host
        self._server = await asyncio.start_server(self._accept, self._host, 0, limit=wire.MAX_LINE)
        port = self._server.sockets[0].getsockname()[1]
        self._keep(asyncio.ensure_future(self._watch()))
        return self._host, int(port)

    async def wait_for_agents(self, count: int, timeout_s: float) -> list[str]:
        """The nodes of the first `count` agents to join; TimeoutError past `timeout_s`."""
        async with self._joined:
            await asyncio.wait_for(
                self._joined.wait_for(lambda: len(self.live()) >= count), timeout_s
            )
        return self.live()[:count]

    async def wait_for_nodes(self, nodes: Collection[str], timeout_s: float) -> set[str]:
        """Those of `nodes` whose agent has joined by `timeout_s` (all of them, sooner)."""
        want = set(nodes)
        with contextlib.suppress(TimeoutError):
            async with self._joined:
                await asyncio.wait_for(
                    self._joined.wait_for(lambda: want <= set(self.live())), timeout_s
                )
        return want & set(self.live())

    def live(self) -> list[str]:
        """The nodes whose agent is connected, in the order they joined."""
        return [n for n, link in self._links.items() if link.lost is None]

    def hung_up(self, node: str) -> bool:
        """Whether `node`'s agent was lost by its connection's end (its process, or its
        step, ended), not by its silence (a machine dead or cut off)."""
        link = self._links.get(node)
        return link is not None and link.lost is not None and not link.silent

    def current_run(self, replica: str) -> tuple[int, int, int | None] | None:
        """(attempt, restart, pid) of the replica's run, while it runs."""
        run = self._runs.get(replica)
        return None if run is None else (run.attempt, run.restart, run.pid)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            msg = wire.decode(await reader.readline(), wire.AGENT_SAYS)
            why = wire.refusal(msg, self.job, self.token)
            if why is None and msg["node"] in self.live():
                why = f"node {msg['node']} has an agent already"
        except wire.ProtocolError as exc:
            why = str(exc)
        if why is not None:
            self.refused.append(why)
            writer.write(wire.encode({"type": "refuse", "why": why}))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
            return
        link = _Link(str(msg["node"]), writer)
        self._links[link.node] = link
        writer.write(wire.encode({"type": "welcome", "preload": self._preload}))
        async with self._joined:
            self._joined.notify_all()
        await self._read(link, reader)

    async def _read(self, link: _Link, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                link.heard_s = time.monotonic()
                self._on_message(link, wire.decode(line, wire.AGENT_SAYS))
            self._lose(link, "its agent closed the connection")
        except (ConnectionError, wire.ProtocolError) as exc:
            self._lose(link, f"its agent's connection failed: {exc}")

    def _on_message(self, link: _Link, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        if kind == "beat":
            return
        if kind == "note":
            self._notes.append(f"node {link.node}: {msg['text']}")
            return
        if kind == "done":
            waiting = link.waiting.pop(int(msg["id"]), None)
            if waiting is not None and not waiting.done():
                waiting.set_result(msg)
            return
        if kind == "output":
            for out in wire.outputs_of(msg):
                self._on_output(out)
            return
        ev = wire.event_of(msg, link.node)
        run = self._runs.get(ev.replica)
        if isinstance(ev, ReplicaStarted) and run is not None and run.node == link.node:
            run.pid = ev.pid
        elif isinstance(ev, ReplicaExited):
            if run is None or run.node != link.node:
                return  # reported lost with its node already
            del self._runs[ev.replica]
            if self._logs is not None:
                self._logs.close(ev.replica)
            if ev.evidence.stop_requested and not ev.evidence.log_tail:  # not sent: ours
                ev = replace(ev, evidence=replace(ev.evidence, log_tail=self.log_tail(ev.replica)))
        self._emit(ev)

    def _on_output(self, ev: ReplicaOutput) -> None:
        tail = self._tails[ev.replica]
        for segment in ev.segments:
            tail.append(segment)
        if self._logs is not None:
            self._logs.write(ev.replica, ev.segments)
        self._last_output[ev.replica] = ev.time_s
        self._newest_output_s = max(self._newest_output_s, ev.time_s)
        if self._tee is not None:  # flushed by the watch, a few times a second
            with contextlib.suppress(OSError, ValueError):
                self._tee.write("".join(f"[{ev.replica}]: {s}\n" for s in ev.segments))
        self._emit(ev)

    async def _watch(self) -> None:
        """Beats out, and silence judged. A stall of this loop (the master busy or starved
        of CPU) is forgiven: the agents' beats wait unread in the sockets meanwhile, so the
        time this loop was not looking counts against no agent."""
        looked_s = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_S)
            now = time.monotonic()
            stalled = now - looked_s - WATCH_S
            looked_s = now
            if stalled > BEAT_S:
                for link in self._links.values():
                    link.heard_s += stalled
                continue
            beat = now - self._beat_s >= BEAT_S
            if beat:
                self._beat_s = now
            if self._tee is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._tee.flush()
            if self._logs is not None:
                self._logs.flush()
            for link in list(self._links.values()):
                if beat:
                    link.say({"type": "beat", "time_s": time.time()})
                if link.lost is None and now - link.heard_s > AGENT_SILENT_S:
                    # Its node died when it fell silent: before the errors its death caused
                    # its peers, which the master must not take for the root cause.
                    last_s = time.time() - (now - link.heard_s)
                    link.silent = True
                    self._lose(link, f"its agent was silent for {now - link.heard_s:.1f} s", last_s)

    def _lose(self, link: _Link, why: str, at_s: float | None = None) -> None:
        """The node is lost (at `at_s`, default now): each replica still running there
        exits with `node_lost`."""
        if link.lost is not None:
            return
        link.lost = why
        link.writer.close()
        for waiting in link.waiting.values():
            if not waiting.done():
                waiting.set_result(None)
        text = f"node {link.node} lost: {why}"
        for replica, run in [(r, run) for r, run in self._runs.items() if run.node == link.node]:
            del self._runs[replica]
            if self._logs is not None:
                self._logs.close(replica)
            ev = ExitEvidence(replica, None, log_tail=self.log_tail(replica), node_lost=text)
            seen_s = time.time() if at_s is None else at_s
            self._emit(ReplicaExited(run.attempt, replica, run.restart, run.pid, ev, seen_s))

    async def _order(
        self, node: str, msg: dict[str, Any], within_s: float = ANSWER_S
    ) -> dict[str, Any] | None:
        """The agent's answer to an order (None: its node is lost, or is now)."""
        link = self._links[node]
        if link.lost is not None:
            return None
        order = next(self._ids)
        answer: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        link.waiting[order] = answer
        link.say({**msg, "id": order})
        try:
            return await asyncio.wait_for(answer, within_s)
        except TimeoutError:
            self._lose(link, f"its agent did not answer a {msg['type']} in {within_s:.0f} s")
            return None

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -------------------------------------------------------------- the seam

    @property
    def warm_start_notes(self) -> Sequence[str]:
        return self._notes

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self._emit = emit

    async def channel_host(self) -> str:
        return self._host

    async def rendezvous(self) -> tuple[str, int]:
        return self._host, free_port(self._host)

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        return {r: kept.get(r) or f"{self._host}:{free_port(self._host)}" for r in replicas}

    async def start(self, launches: Sequence[Launch]) -> None:
        """Round-robin by rank over the connected agents."""
        nodes = self.live()
        where = {la.replica: nodes[la.rank % len(nodes)] for la in launches if nodes}
        await self.start_on(launches, where)

    async def start_on(self, launches: Sequence[Launch], where: Mapping[str, str]) -> None:
        """Each launch on the agent of its node in `where`; one whose node has no agent (or
        none given) exits at once as lost there."""
        by_node: dict[str, list[Launch]] = {}
        for launch in launches:
            node = where.get(launch.replica)
            link = self._links.get(node or "")
            if node is None or link is None or link.lost is not None:
                why = f"node {node}: {link.lost if link else 'it has no agent'}" if node else ""
                ev = ExitEvidence(
                    launch.replica, None, node_lost=why or "no node agent is connected"
                )
                self._emit(
                    ReplicaExited(
                        launch.attempt, launch.replica, launch.restart, None, ev, time.time()
                    )
                )
                continue
            self._runs[launch.replica] = _Run(node, launch.attempt, launch.restart)
            self._tails[launch.replica] = Tail()
            if self._logs is not None:
                launch = self._logs.open(launch)
            by_node.setdefault(node, []).append(launch)
        for node, group in by_node.items():
            self._links[node].say({"type": "start", **wire.launches_message(group)})
        self._warmed.update(by_node)
        if by_node:  # the nodes with none of them (spares) plan their zygote for such ranks
            like = wire.launches_message(next(iter(by_node.values())))
            for node in self.live():
                if node not in self._warmed:
                    self._links[node].say({"type": "warm", **like})
                    self._warmed.add(node)

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        by_node: dict[str, list[str]] = {}
        for replica in replicas:
            if (run := self._runs.get(replica)) is not None:
                by_node.setdefault(run.node, []).append(replica)
        orders = (
            self._order(node, {"type": "stop", "replicas": group, "grace_s": grace_s})
            for node, group in by_node.items()
        )
        await asyncio.gather(*orders)

    async def signal(self, replica: str, signum: int) -> bool:
        run = self._runs.get(replica)
        if run is None:
            return False
        answer = await self._order(
            run.node, {"type": "signal", "replica": replica, "signum": signum}
        )
        return answer is not None and bool(answer.get("ok"))

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        if replicas is None:
            return self._newest_output_s
        last = self._last_output
        return max((last.get(r, 0.0) for r in replicas), default=0.0)

    def log_tail(self, replica: str) -> tuple[str, ...]:
        tail = self._tails.get(replica)
        return tail.lines() if tail is not None else ()

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        """Each node's agent takes its replicas' stacks there, all nodes at once."""
        by_node: dict[str, list[tuple[str, int, int]]] = {}
        for target in targets:
            run = self._runs.get(target[0])
            by_node.setdefault(run.node if run else "", []).append(target)

        async def on(node: str, group: list[tuple[str, int, int]]) -> list[ReplicaStacks]:
            files = {
                r: self._stacks_file(r, faulthandler_files[r])
                for r, _, _ in group
                if r in faulthandler_files
            }
            order = {"type": "stacks", "targets": group, "timeout_s": timeout_s}
            answer = None
            if node:
                order["faulthandler_files"] = files
                answer = await self._order(node, order, timeout_s + ANSWER_S)
            if answer is None or "stacks" not in answer:
                why = (
                    f"no stacks: node {node}'s agent is lost" if node else "no stacks: not running"
                )
                return [
                    ReplicaStacks(r, rank, pid, "none", False, why, 0.0, ())
                    for r, rank, pid in group
                ]
            return [ReplicaStacks.from_dict(d) for d in answer["stacks"]]

        found = await asyncio.gather(*(on(n, g) for n, g in by_node.items()))
        return [stacks for group in found for stacks in group]

    def _stacks_file(self, replica: str, path: Path) -> str:
        """Where the node writes the replica's stack dumps: under its own temporary
        folder where the master keeps the logs (`MasterLogs.open`), else as the master said."""
        if self._logs is None:
            return str(path)
        return self._logs.node_stacks.get(replica, str(path))

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        return None

    async def close(self) -> None:
        """Each agent is told to close (it stops its replicas first); then the listener ends."""
        if self._logs is not None:
            self._logs.close_all()
        for link in self._links.values():
            link.say({"type": "close"})
            link.lost = link.lost or "closed"
            link.writer.close()
            with contextlib.suppress(ConnectionError):
                await link.writer.wait_closed()
        for task in self._tasks:
            task.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
