"""The node check on a Slurm allocation: one `srun` step on each usable node at once (beside
nothing: the attempt is stopped), judged by `policy.node_check`, bad nodes kept out while a
spare is left. The backend applies the exclusion (`srun --exclude`, as for a lost node)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence

from trainguard.backends.interface import NodeCheckOutcome
from trainguard.backends.node_check.run import CheckNotRun, lines_of, run_check
from trainguard.backends.slurm.cluster import Node
from trainguard.policy.node_check import CHECK_LIMIT_S, describe_check, judge, keep_out


def check_step(job_id: str, node: str, argv: Sequence[str]) -> list[str]:
    """The check as a step of the allocation on `node` (overlapping: it needs no CPU of
    its own)."""
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--job-name=trainguard-node-check",
        "--kill-on-bad-exit=1",
        *argv,
    ]


async def check_allocation(
    job_id: str,
    nodes: Mapping[str, Node],
    usable: Sequence[str],
    need: int,
    reason: str,
    limit_s: float = CHECK_LIMIT_S,
) -> tuple[NodeCheckOutcome, dict[str, str]]:
    """(what the check found, node -> why it is to be excluded)."""

    async def start(node: str, argv: Sequence[str], timeout_s: float) -> AsyncIterator[str]:
        try:
            async for line in lines_of(check_step(job_id, node, argv)):
                yield line
        except CheckNotRun as exc:
            raise CheckNotRun(_srun_error(str(exc))) from None

    t0 = time.monotonic()
    reports = await run_check([(n, nodes[n].addr) for n in usable], start, limit_s)
    verdict = judge(usable, reports)
    plan = keep_out(verdict, usable, need)
    note = describe_check(reason, verdict, plan, time.monotonic() - t0)
    excluded = {n: f"node check: {n} {why}" for n, why in plan.excluded.items()}
    outcome = NodeCheckOutcome(
        note + (f" (srun --exclude={','.join(excluded)})" if excluded else ""),
        excluded=tuple(excluded),
        changed=not verdict.passed,
        passed=() if verdict.unclear else tuple(n for n in usable if n not in verdict.bad),
    )
    return outcome, excluded


def _srun_error(text: str) -> str:
    """srun's first error line ("srun: error: Task launch ... failed on node n2: ..."),
    not the command line the error repeats."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = next((line for line in lines if "error:" in line), lines[-1] if lines else text)
    return found[found.find("srun:") :][:240] if "srun:" in found else found[-240:]
