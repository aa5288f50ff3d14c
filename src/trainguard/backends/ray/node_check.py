"""The node check on a Ray cluster: one task pinned to each alive node (hard node affinity,
no CPU of its own) runs the check's script there with that node's Python; bad nodes are
kept out of the next placement group (`bundle_label_selector` on `ray.io/node-id`, as a
lost node is) while the cluster keeps as many nodes as the last placement used."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from trainguard.backends.interface import NodeCheckOutcome
from trainguard.backends.node_check.run import CheckNotRun, run_check
from trainguard.backends.ray.calls import one_line
from trainguard.policy.node_check import CHECK_LIMIT_S, describe_check, judge, keep_out


def _run_here(argv: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
    """On the node (a Ray task): the check with this node's own Python."""
    try:
        done = subprocess.run(
            [sys.executable, *argv[1:]], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout_s:g} s"
    return done.returncode, done.stdout, done.stderr[-300:]


def alive_nodes(ray: Any) -> dict[str, str]:
    """node id -> its address, for every node Ray says is alive."""
    return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}


async def check_cluster(
    ray: Any,
    nodes: Mapping[str, str],
    need: int,
    reason: str,
    limit_s: float = CHECK_LIMIT_S,
) -> tuple[NodeCheckOutcome, dict[str, str]]:
    """(what the check found, node id -> why it is to be excluded); `nodes`: id -> address."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(_run_here)
    short = {node_id: f"{addr}/{node_id[:12]}" for node_id, addr in nodes.items()}
    by_name = {name: node_id for node_id, name in short.items()}

    async def start(name: str, argv: Sequence[str], timeout_s: float) -> AsyncIterator[str]:
        where = NodeAffinitySchedulingStrategy(by_name[name], soft=False)
        try:
            code, out, err = await task.options(scheduling_strategy=where).remote(
                list(argv), timeout_s
            )
        except Exception as exc:  # the task could not run there (its node died)
            raise CheckNotRun(one_line(exc)) from None
        if code:
            raise CheckNotRun(err.strip().splitlines()[-1] if err.strip() else f"exit {code}")
        for line in str(out).splitlines():  # a task answers once, at its end
            yield line

    t0 = time.monotonic()
    names = list(short.values())
    reports = await run_check([(short[i], a) for i, a in nodes.items()], start, limit_s)
    verdict = judge(names, reports)
    plan = keep_out(verdict, names, need)
    note = describe_check(reason, verdict, plan, time.monotonic() - t0)
    excluded = {by_name[n]: f"node check: {n} {why}" for n, why in plan.excluded.items()}
    found = NodeCheckOutcome(note, tuple(plan.excluded), changed=not verdict.passed)
    return found, excluded
