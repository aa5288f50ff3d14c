"""Start the node check on every node at once and read each one's answer, within one limit.

How a command reaches a node is the backend's (`srun` on a Slurm node, `nsenter` on a test
host): it hands `run_check` a `Starter`. Nothing here blocks the master's loop: the nodes'
checks are child processes awaited together, and a node that has not answered by the limit
is reported as timed out (its own script exits by the same deadline)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from trainguard.backends.net import QUIET_PORTS
from trainguard.policy.node_check import (
    CHECK_LIMIT_S,
    COLLECTIVE_TIMEOUT_S,
    NodeReport,
    PairResult,
    ring_pairs,
)

Starter = Callable[[str, Sequence[str], float], AsyncIterator[str]]
"""(node, argv, timeout_s) -> the lines the command prints on that node, as they come;
raises CheckNotRun where it could not run there. Closing it early stops the command."""


class CheckNotRun(Exception):
    """The check could not be started on a node, or did not answer in time."""


def worker_argv(
    index: int,
    addrs: Sequence[str],
    ports: Sequence[int],
    limit_s: float,
    python: str = sys.executable,
) -> list[str]:
    """The command node `index` runs; it gives up 1 s before the limit, so it answers."""
    spec = {
        "index": index,
        "addrs": list(addrs),
        "ports": list(ports),
        "pairs": [list(p) for p in ring_pairs(len(addrs))],
        "collective_s": COLLECTIVE_TIMEOUT_S,
        "deadline_s": max(1.0, limit_s - 1.0),
    }
    return [python, "-m", "trainguard.backends.node_check.worker", json.dumps(spec)]


class _Answers:
    """What each node printed so far: its kernel's result, each world's as it ended."""

    def __init__(self, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        self.worlds = ring_pairs(len(nodes))
        self.compute: dict[str, dict[str, object]] = {}
        self.pairs: dict[str, dict[int, PairResult]] = {n: {} for n in nodes}
        self.failed: dict[str, str] = {}  # node -> why it has no answer

    def feed(self, node: str, line: str) -> None:
        try:
            raw = json.loads(line)
            if "compute" in raw:
                c = raw["compute"]
                self.compute[node] = {k: c[k] for k in ("compute_ok", "compute_s")}
                self.compute[node]["error"] = str(c.get("compute_error", ""))
                self.compute[node]["kernel"] = str(c.get("kernel", ""))
            elif "pair" in raw:
                self.pairs[node][int(raw["pair"])] = _pair(raw)
            elif "pairs" in raw:  # the whole report, last: the worlds still open ended late
                for w, p in raw["pairs"].items():
                    self.pairs[node].setdefault(int(w), _pair(p))
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # not a line of the check (a warning it printed): nothing to read

    def ended(self, node: str) -> None:
        """`node`'s check is over: what it did not say, it never will."""
        if node not in self.compute:
            self.failed.setdefault(node, "no answer: nothing printed")
            return
        index = self.nodes.index(node)
        for w, pair in enumerate(self.worlds):
            if index in pair:
                self.pairs[node].setdefault(w, PairResult(False, 0.0, "its check ended first"))

    def settled(self) -> bool:
        """Every node answered all it can: its kernel, and each world whose peer runs."""
        for index, node in enumerate(self.nodes):
            if node in self.failed:
                continue
            if node not in self.compute:
                return False
            for w, pair in enumerate(self.worlds):
                peer = self.nodes[pair[1] if pair[0] == index else pair[0]]
                if index in pair and peer not in self.failed and w not in self.pairs[node]:
                    return False
        return True

    def reports(self, limit_s: float) -> dict[str, NodeReport | str]:
        out: dict[str, NodeReport | str] = {}
        for node in self.nodes:
            c = self.compute.get(node)
            if node in self.failed:
                out[node] = self.failed[node]
            elif c is None:
                out[node] = f"timed out after {limit_s:g} s"
            else:
                ok, seconds = bool(c["compute_ok"]), float(str(c["compute_s"]))
                out[node] = NodeReport(
                    ok, seconds, str(c["error"]), self.pairs[node], str(c["kernel"])
                )
        return out


async def run_check(
    nodes: Sequence[tuple[str, str]],
    start: Starter,
    limit_s: float = CHECK_LIMIT_S,
    ports: Sequence[int] | None = None,
) -> dict[str, NodeReport | str]:
    """Each node (name, address) -> its report, or why there is none. Ends as soon as every
    node has answered what it can (a world with a node that could not start never ends),
    else at `limit_s`."""
    addrs = [addr for _, addr in nodes]
    ports = list(ports) if ports is not None else _ports(len(ring_pairs(len(nodes))))
    answers = _Answers([name for name, _ in nodes])
    settled = asyncio.Event()

    async def one(index: int, name: str) -> None:
        try:
            async for line in start(name, worker_argv(index, addrs, ports, limit_s), limit_s):
                answers.feed(name, line)
                if answers.settled():
                    settled.set()
        except CheckNotRun as exc:
            answers.failed[name] = str(exc)
        answers.ended(name)
        if answers.settled():
            settled.set()

    tasks = [asyncio.ensure_future(one(i, name)) for i, (name, _) in enumerate(nodes)]
    try:
        await asyncio.wait_for(settled.wait(), limit_s + 1.0)
    except TimeoutError:
        pass  # who has not answered by now counts as timed out
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return answers.reports(limit_s)


async def lines_of(argv: Sequence[str]) -> AsyncIterator[str]:
    """A local command's stdout lines as they come (a check started through srun or
    nsenter); CheckNotRun with its last stderr line if it fails. Killed when closed."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise CheckNotRun(f"{argv[0]} could not be started here: {exc.strerror or exc}") from None
    assert proc.stdout is not None and proc.stderr is not None
    try:
        while line := await proc.stdout.readline():
            yield line.decode(errors="replace").strip()
        err = (await proc.stderr.read()).decode(errors="replace")
        if await proc.wait():
            raise CheckNotRun(err.strip() or f"exit status {proc.returncode}")
    finally:
        if proc.returncode is None:  # TERM first: srun passes it on to the step's task
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 1.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _pair(raw: Mapping[str, object]) -> PairResult:
    seconds = raw.get("seconds", 0.0)
    return PairResult(bool(raw["ok"]), float(str(seconds)), str(raw.get("error", "")))


def _ports(count: int) -> list[int]:
    """A port per world, at its first member: drawn apart from the ephemeral range (the
    node is another machine: nothing here can test it free there)."""
    return random.sample(range(QUIET_PORTS[0], QUIET_PORTS[1]), count)
