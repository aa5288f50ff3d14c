"""The master's side of the node agents at scale (issue 40): the real `AgentBackend` and
the real protocol over loopback, against agents that fake their ranks (a test double: one
process of asyncio clients that speak the wire and answer a start with a started event
per rank, then print `--lines-per-s` lines a second per rank). It measures, in the
master's process:

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


async def _fake_agent(address: str, node: str, lines_per_s: float, seconds: float) -> None:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=wire.MAX_LINE)
    writer.write(wire.encode(wire.hello("bench", node, TOKEN, os.getpid())))
    wire.decode(await reader.readline(), wire.MASTER_SAYS)  # welcome
    ranks: list[dict[str, object]] = []

    async def speak() -> None:
        while not ranks:
            await asyncio.sleep(0.01)
        step, end = 1.0 / lines_per_s, time.monotonic() + seconds
        while time.monotonic() < end:
            now = time.time()
            for d in ranks:
                line = f"step {int(now * lines_per_s)} loss 0.5 on {d['replica']}"
                writer.write(
                    wire.encode({**d, "type": "output", "segments": [line], "time_s": now})
                )
            await writer.drain()
            await asyncio.sleep(step)
        first = ranks[0]
        exited = {"replica": first["replica"], "returncode": 1, "log_tail": ["boom"]}
        msg = {**first, "type": "exited", "pid": 1, "evidence": exited, "time_s": time.time()}
        writer.write(wire.encode(msg))
        await writer.drain()

    speaker = asyncio.ensure_future(speak())
    while line := await reader.readline():
        msg = wire.decode(line, wire.MASTER_SAYS)
        if msg["type"] == "start":
            for i, la in enumerate(msg["launches"]):
                head = {"attempt": la["attempt"], "replica": la["replica"], "restart": 0}
                ranks.append(head)
                started = {**head, "type": "started", "pid": 100000 + i, "time_s": time.time()}
                writer.write(wire.encode(started))
            await writer.drain()
        elif msg["type"] == "close":
            break
    speaker.cancel()
    writer.close()


async def _fakes(address: str, nodes: int, lines_per_s: float, seconds: float) -> None:
    await asyncio.gather(
        *(_fake_agent(address, f"node-{i:04d}", lines_per_s, seconds) for i in range(nodes))
    )


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--lines-per-s", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--fake-agents", metavar="HOST:PORT", help=argparse.SUPPRESS)
    args = p.parse_args()
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
