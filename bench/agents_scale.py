"""The master's side of the node agents at scale (issue 40): the real `AgentBackend` and
the real protocol over loopback, against agents that fake their ranks (a test double: one
process of asyncio clients, `FakeAgent`, that speak the wire and answer a start with a
started event per rank, then print `--lines-per-s` lines a second per rank;
`agents_master.py` runs them under the real master). It measures, in the master's process:

- join: from the fakes' start to every agent welcomed;
- fan-out: from `start()` of every launch to every rank's started event received;
- the master's CPU (% of one core) while every rank prints, and the lines it took in;
- exit latency: from a fake rank's exit (its `time_s`) to the master's `ReplicaExited`;
- the master's peak RSS.

    .venv/bin/python bench/agents_scale.py --nodes 128 --ranks-per-node 8 --seconds 10

No peer is run: the ranks are fake, so this is about the master, not about training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainguard.backends.agent import protocol as wire
from trainguard.backends.agent.backend import AgentBackend
from trainguard.backends.interface import (
    BackendEvent,
    Launch,
    ReplicaExited,
    ReplicaOutput,
    ReplicaStarted,
)

TOKEN = "bench-token"


class FakeAgent:
    """One node's agent, faked over the real wire: a start is answered with a started event
    per rank, each running rank prints `lines_per_s` lines a second, a stop is answered
    with each stopped rank's exit and then `done`, and it beats as a real agent does. What
    came when is kept (`starts`, `stops`), on this machine's `time.time()`.

    `exit_after_s`: its first rank exits (status 1) after printing that long (None: only
    when told, `exit`). `job`: the job it says hello for."""

    def __init__(
        self, node: str, lines_per_s: float, exit_after_s: float | None = None, job: str = "bench"
    ) -> None:
        self.node, self.lines_per_s, self.exit_after_s = node, lines_per_s, exit_after_s
        self.job = job
        self.running: dict[str, dict[str, object]] = {}  # replica -> attempt, replica, restart
        self.pids: dict[str, int] = {}  # replica -> its fake pid
        self.starts: list[tuple[int, float, float]] = []  # attempt, order came, all started sent
        self.stops: list[float] = []  # when each stop order came
        self._writer: asyncio.StreamWriter | None = None

    def _say(self, msg: dict[str, object]) -> None:
        assert self._writer is not None
        self._writer.write(wire.encode(msg))

    def exit(self, replica: str, returncode: int, stop_requested: bool = False) -> float:
        """`replica` exits with `returncode`; when it was sent."""
        head = self.running.pop(replica)
        # A full tail, as a real agent sends with a failure; none with a stopped exit (the
        # master has the output).
        tail = [] if stop_requested else [f"step {n} loss 0.5 on {replica}" for n in range(200)]
        evidence = {"replica": replica, "returncode": returncode, "log_tail": tail}
        evidence["stop_requested"] = stop_requested
        now = time.time()
        pid = self.pids[replica]
        self._say({**head, "type": "exited", "pid": pid, "evidence": evidence, "time_s": now})
        return now

    async def _speak(self) -> None:
        step, beat_s, began = 1.0 / self.lines_per_s, 0.0, None
        while True:
            now = time.time()
            if now - beat_s >= 0.5:
                beat_s = now
                self._say({"type": "beat", "time_s": now})
            items = [  # a tick's lines in one message, as the agent batches them
                [
                    h["attempt"],
                    h["replica"],
                    h["restart"],
                    [f"step {int(now * self.lines_per_s)} loss 0.5 on {h['replica']}"],
                    now,
                ]
                for h in list(self.running.values())
            ]
            if items:
                self._say({"type": "output", "items": items})
            first = next(iter(self.running), None)
            if first is not None and began is None:
                began = time.monotonic()
            printed_s = 0.0 if began is None else time.monotonic() - began
            after = float("inf") if self.exit_after_s is None else self.exit_after_s
            if first is not None and printed_s >= after:
                self.exit(first, 1)
                self.exit_after_s = None
            assert self._writer is not None
            await self._writer.drain()
            await asyncio.sleep(step)

    async def run(self, address: str) -> None:
        """Join the master at `address` (HOST:PORT), then obey it until it says close."""
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port), limit=wire.MAX_LINE)
        self._writer = writer
        self._say(wire.hello(self.job, self.node, TOKEN, os.getpid()))
        wire.decode(await reader.readline(), wire.MASTER_SAYS)  # welcome
        speaker = asyncio.ensure_future(self._speak())
        try:
            while line := await reader.readline():
                msg = wire.decode(line, wire.MASTER_SAYS)
                if msg["type"] == "start":
                    came = time.time()
                    for la in msg["launches"]:
                        head = {k: la[k] for k in ("attempt", "replica", "restart")}
                        self.running[la["replica"]] = head
                        pid = self.pids[la["replica"]] = 100000 + int(la["rank"])  # a fake
                        self._say({**head, "type": "started", "pid": pid, "time_s": time.time()})
                    await writer.drain()
                    self.starts.append((int(msg["launches"][0]["attempt"]), came, time.time()))
                elif msg["type"] == "stop":
                    self.stops.append(time.time())
                    for replica in msg["replicas"]:
                        if replica in self.running:
                            self.exit(replica, -15, stop_requested=True)
                    self._say({"type": "done", "id": msg["id"], "ok": True})
                elif msg["type"] == "signal":
                    self._say({"type": "done", "id": msg["id"], "ok": False})
                elif msg["type"] == "stacks":
                    self._say({"type": "done", "id": msg["id"], "stacks": []})
                elif msg["type"] == "close":
                    break
        finally:
            speaker.cancel()
            writer.close()


async def _fakes(address: str, nodes: int, lines_per_s: float, seconds: float) -> None:
    agents = [FakeAgent(f"node-{i:04d}", lines_per_s, seconds) for i in range(nodes)]
    await asyncio.gather(*(agent.run(address) for agent in agents))


async def _measure(args: argparse.Namespace) -> dict[str, float]:
    seen: list[tuple[float, BackendEvent]] = []
    backend = AgentBackend("bench", TOKEN)
    backend.bind(lambda ev: seen.append((time.time(), ev)))
    host, port = await backend.listen()
    t0 = time.monotonic()
    fakes = subprocess.Popen(
        [sys.executable, __file__, "--fake-agents", f"{host}:{port}", "--nodes", str(args.nodes),
         "--lines-per-s", str(args.lines_per_s), "--seconds", str(args.seconds)]
    )  # fmt: skip
    try:
        await backend.wait_for_agents(args.nodes, 120)
        join_s = time.monotonic() - t0
        ranks = args.nodes * args.ranks_per_node
        launches = [
            Launch(0, f"worker-{r}", r, 0, ("train",), {}, "/", Path("/dev/null"))
            for r in range(ranks)
        ]
        t1 = time.monotonic()
        await backend.start(launches)
        while sum(isinstance(ev, ReplicaStarted) for _, ev in seen) < ranks:
            await asyncio.sleep(0.005)
        fanout_s = time.monotonic() - t1
        cpu0, w0 = time.process_time(), time.monotonic()
        while not any(isinstance(ev, ReplicaExited) for _, ev in seen):
            await asyncio.sleep(0.05)
            if time.monotonic() - w0 > args.seconds + 60:
                raise TimeoutError("no exit came")
        busy = (time.process_time() - cpu0) / (time.monotonic() - w0)
        lines = sum(len(ev.segments) for _, ev in seen if isinstance(ev, ReplicaOutput))
        exits = [got - ev.time_s for got, ev in seen if isinstance(ev, ReplicaExited)]
        return {
            "nodes": args.nodes,
            "ranks": ranks,
            "join_s": join_s,
            "fanout_s": fanout_s,
            "master_cpu_pct": 100 * busy,
            "lines": lines,
            "exit_latency_ms": 1000 * statistics.median(exits),
            "master_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    finally:
        await backend.close()
        fakes.wait(timeout=60)


def fleet_parser(doc: str) -> argparse.ArgumentParser:
    """The flags of a measurement against fake agents, which agents_master.py takes too: the
    fleet's size and output, how many runs, and (hidden) the master the fakes' process joins."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--lines-per-s", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--fake-agents", metavar="HOST:PORT", help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = fleet_parser(__doc__).parse_args()
    if args.fake_agents:
        asyncio.run(_fakes(args.fake_agents, args.nodes, args.lines_per_s, args.seconds))
        return
    runs = [asyncio.run(_measure(args)) for _ in range(args.runs)]
    for key in runs[0]:
        values = [r[key] for r in runs]
        print(f"{key:<18} median {statistics.median(values):10.3f}   runs {values}")
    print(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main()
