"""Where each replica of an attempt runs in the allocation, and the `srun` that starts it.

Pure: the nodes, their health and the launches are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainguard.backends.api import Launch


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


def srun_argv(
    launch: Launch,
    node: str,
    job_id: str,
    excluded: Sequence[str] = (),
    extra: Sequence[str] = (),
) -> list[str]:
    """One job step of one task on `node`, with the replica's environment and working
    folder, its output unbuffered, named after the replica (so `squeue -s` finds it)."""
    argv = [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",  # steps share the allocation's CPUs: a hang's snapshot step too
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--export=ALL",
        f"--chdir={launch.cwd}",
        f"--job-name={launch.replica}",
    ]
    if excluded:
        argv.append(f"--exclude={','.join(sorted(excluded))}")
    return [*argv, *extra, *launch.argv]
