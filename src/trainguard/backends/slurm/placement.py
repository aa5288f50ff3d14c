"""Where each replica of an attempt runs in the allocation, and the `srun` that starts it.

Pure: the nodes, their health and the launches are arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from trainguard.backends.interface import Launch
from trainguard.backends.slurm.node_probe import wrapped_argv
from trainguard.frameworks.node_env import placed_envs, slots, slurm_env


def place(
    ranks: Sequence[tuple[str, int]],
    usable: Sequence[str],
    tasks_per_node: int,
    kept: Mapping[str, str] | None = None,
) -> dict[str, str] | str:
    """replica -> node: rank r on the (r // tasks_per_node)-th usable node, in Slurm's node
    order; or why the allocation cannot hold them now. `kept`: replicas restarted alone
    stay on their node while it is usable, else take a node none of the others use."""
    kept = kept or {}
    if not ranks:
        return {}
    ordered = sorted(ranks, key=lambda rr: rr[1])
    if kept:  # a restart of some replicas within a running attempt
        out: dict[str, str] = {}
        busy = {n for n in kept.values() if n in usable}
        spare = [n for n in usable if n not in busy]
        for replica, _ in ordered:
            node = kept.get(replica)
            if node is not None and node in usable:
                out[replica] = node
            elif spare:
                out[replica] = spare.pop(0)
            else:
                return f"no usable node of the allocation is free for {replica}"
        return out
    need = (len(ordered) + tasks_per_node - 1) // tasks_per_node
    if len(usable) < need:
        return (
            f"the job needs {need} node(s) of {tasks_per_node} task(s), and the allocation "
            f"has {len(usable)} usable"
        )
    return {replica: usable[i // tasks_per_node] for i, (replica, _) in enumerate(ordered)}


def layout_env(
    launches: Mapping[str, Launch], nodes: Mapping[str, str]
) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """replica -> (the changes to its environment, its Slurm task variables) that the
    layout of the attempt (`launches`: all of it so far, `nodes`: where each runs) gives.

    Each rank is a step of one task, so Slurm would tell it "task 0 of 1 on node 0": the
    task variables say what one `srun` of the whole layout would (`slurm_env`); they are set
    in the task itself (`srun_argv`), as slurmstepd overwrites what `--export` passes."""
    placed = {r: la for r, la in launches.items() if r in nodes}
    changes = placed_envs({r: (la.rank, la.env) for r, la in placed.items()}, nodes)
    ordered = sorted(placed, key=lambda r: placed[r].rank)
    where = slots({r: (placed[r].rank, nodes[r]) for r in ordered})
    return {
        r: (changes[r], slurm_env(where[r], task, len(ordered))) for task, r in enumerate(ordered)
    }


def srun_argv(
    launch: Launch,
    node: str,
    job_id: str,
    excluded: Sequence[str] = (),
    extra: Sequence[str] = (),
    task_env: Mapping[str, str] | None = None,
    probe: bool = False,
) -> list[str]:
    """One job step of one task on `node`, with the replica's environment and working
    folder, its output unbuffered, named after the replica (so `squeue -s` finds it);
    `task_env` is set by `env` in the task, over what Slurm sets there; `probe`: the
    program runs under `node_probe`, which reads the node when it fails."""
    argv = [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",  # steps share the allocation's CPUs: a hang's stack dump step too
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--export=ALL",
        f"--chdir={launch.cwd}",
        f"--job-name={launch.replica}",
    ]
    if excluded:
        argv.append(f"--exclude={','.join(sorted(excluded))}")
    prefix = ["env", "--", *(f"{k}={v}" for k, v in sorted(task_env.items()))] if task_env else []
    program = wrapped_argv(launch.argv, [launch.cwd]) if probe else list(launch.argv)
    return [*argv, *extra, *prefix, *program]


_NODE_FAILURE = re.compile(r"^srun: error: Node failure on (\S+)")


def node_failure(tail: Sequence[str]) -> str | None:
    """The node srun says failed under its step ("srun: error: Node failure on n2", which
    srun prints with exit status 0), or None."""
    for line in reversed(tail[-20:]):
        m = _NODE_FAILURE.match(line.strip())
        if m:
            return m.group(1)
    return None


_STEP_LOST = re.compile(r"^srun: error: .*io error with slurmstepd on node \d+")


def step_lost(tail: Sequence[str]) -> bool:
    """srun lost its step before slurmctld said why ("step_launch_notify_io_failure:
    aborting, io error with slurmstepd on node 0", then "Timed out waiting for job step to
    complete"): what it says, with exit status 0, when the node under its task dies under
    load (seen 1 run in ~10 of the real cluster's node death). Not a success: its node is
    probed."""
    return any(_STEP_LOST.match(line.strip()) for line in tail[-20:])
