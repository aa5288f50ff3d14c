"""What a rank's environment owes to where the ranks landed (issue 37).

A preset builds each replica's environment before the backend places it, so what depends
on the placement (which ranks share a node) is filled in after it, here: the values
`srun torchrun` gives the same layout. A node's ranks are its local ranks in rank order;
nodes are numbered in the order of their lowest rank (torchrun's `--node-rank`, Slurm's
`SLURM_NODEID` when ranks fill the nodes in order). Pure: placements in, variables out.

- torchrun's node variables (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `GROUP_RANK`,
  `GROUP_WORLD_SIZE`, and `NODE_RANK` beside `GROUP_RANK`) are rewritten where the preset
  set them, within each process group: the ranks that meet at one store (`MASTER_ADDR`,
  `MASTER_PORT`; a torchft replica group has its own).
- `CUDA_VISIBLE_DEVICES`: every rank of a node sees the GPUs of all the node's ranks of
  its process group (of all the node's ranks, for one outside any), in local-rank order,
  as under torchrun, so `cuda:LOCAL_RANK` is the rank's own GPU. One machine is one node
  (`backends.local.node_layout`): the same layout, from the ids the master handed out
  (`OWN_DEVICES`).
- Slurm's task variables (`slurm_env`): what one `srun` of the whole layout would set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEVICES = "CUDA_VISIBLE_DEVICES"
# The GPU ids the master handed a replica itself (beside DEVICES, which a layout widens):
# read by the one-machine layout, removed by every backend before a process sees it.
OWN_DEVICES = "TRAINGUARD_OWN_DEVICES"
_TORCHRUN_NODE = ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")


@dataclass(frozen=True)
class Slot:
    """Where one rank landed, and the layout around it."""

    node: str
    node_rank: int  # the node's place among the job's nodes (by their lowest rank)
    local_rank: int  # the rank's place among its node's ranks (by rank)
    node_ranks: tuple[int, ...]  # the ranks on its node, in order
    per_node: tuple[int, ...]  # how many ranks each node holds, in node order
    nodes: tuple[str, ...]  # the job's nodes, in node order

    @property
    def local_world(self) -> int:
        return len(self.node_ranks)


def slots(placed: Mapping[str, tuple[int, str]]) -> dict[str, Slot]:
    """replica -> its Slot, from replica -> (rank, node)."""
    on: dict[str, list[tuple[int, str]]] = {}
    for replica, (rank, node) in sorted(placed.items(), key=lambda kv: kv[1][0]):
        on.setdefault(node, []).append((rank, replica))
    nodes = tuple(on)  # dicts keep insertion order: by each node's lowest rank
    per_node = tuple(len(on[n]) for n in nodes)
    out: dict[str, Slot] = {}
    for node_rank, node in enumerate(nodes):
        ranks = tuple(r for r, _ in on[node])
        for local, (_, replica) in enumerate(on[node]):
            out[replica] = Slot(node, node_rank, local, ranks, per_node, nodes)
    return out


def torchrun_env(slot: Slot, present: Sequence[str]) -> dict[str, str]:
    """torchrun's node variables for `slot`: those of `present` the preset set."""
    values = {
        "LOCAL_RANK": str(slot.local_rank),
        "LOCAL_WORLD_SIZE": str(slot.local_world),
        "GROUP_RANK": str(slot.node_rank),
        "GROUP_WORLD_SIZE": str(len(slot.nodes)),
    }
    out = {k: v for k, v in values.items() if k in present}
    if "GROUP_RANK" in out:
        out["NODE_RANK"] = out["GROUP_RANK"]  # what Lightning and most launch scripts read
    return out


def placed_envs(
    launches: Mapping[str, tuple[int, Mapping[str, str]]],
    nodes: Mapping[str, str],
    devices: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, dict[str, str]]:
    """replica -> the variables its placement changes, for every replica of `launches`
    (replica -> (global rank, the environment its preset gave it): the attempt's) that
    `nodes` places.

    `devices`: each replica's own GPU ids as its node numbers them; without it, ids the
    master handed out from one machine's list (`CUDA_VISIBLE_DEVICES` in the environments)
    are laid out again node by node (`node_local_devices`)."""
    placed = {r: (rank, nodes[r]) for r, (rank, _) in launches.items() if r in nodes}
    envs = {r: launches[r][1] for r in sorted(placed, key=lambda r: placed[r][0])}
    out: dict[str, dict[str, str]] = {r: {} for r in envs}
    groups: dict[tuple[str, str], dict[str, tuple[int, str]]] = {}
    group_of: dict[str, tuple[str, str]] = {}
    for replica, env in envs.items():
        if "LOCAL_RANK" in env and env.get("RANK", "").isdigit():
            key = group_of[replica] = (env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""))
            groups.setdefault(key, {})[replica] = (int(env["RANK"]), nodes[replica])
    for members in groups.values():
        for replica, slot in slots(members).items():
            present = [k for k in _TORCHRUN_NODE if k in envs[replica]]
            out[replica].update(torchrun_env(slot, present))
    if devices is None:
        devices = node_local_devices(envs, nodes)
    # (node, group or None for the whole node) -> its ids, in rank order: local-rank order
    on: dict[tuple[str, tuple[str, str] | None], list[str]] = {}
    for replica in envs:
        ids = devices.get(replica, ())
        on.setdefault((nodes[replica], None), []).extend(ids)
        if replica in group_of:
            on.setdefault((nodes[replica], group_of[replica]), []).extend(ids)
    for replica in envs:
        if devices.get(replica):
            out[replica][DEVICES] = ",".join(on[nodes[replica], group_of.get(replica)])
    return out


def node_local_devices(
    envs: Mapping[str, Mapping[str, str]], nodes: Mapping[str, str]
) -> dict[str, tuple[str, ...]]:
    """Each replica's own GPU ids on its node, from ids handed out on one machine's list
    (`envs` in rank order, as `policy.gpus` hands them out): the k-th GPU a node's ranks
    hold is the k-th id of that list, so every node of a uniform cluster uses the same
    ids. Nothing where the replicas hold no ids of their own (none, or one inherited list
    they all share: left as it is)."""
    mine = {r: id_list(env.get(DEVICES)) for r, env in envs.items() if r in nodes}
    if len(set(mine.values())) <= 1:
        return {}
    sequence = [g for ids in mine.values() for g in ids]
    out: dict[str, tuple[str, ...]] = {}
    used: dict[str, int] = {}
    for replica, ids in mine.items():
        start = used.get(nodes[replica], 0)
        out[replica] = tuple(sequence[start : start + len(ids)])
        used[nodes[replica]] = start + len(ids)
    return out


def id_list(value: str | None) -> tuple[str, ...]:
    """The ids of a `CUDA_VISIBLE_DEVICES`-style list."""
    return tuple(g.strip() for g in (value or "").split(",") if g.strip())


def slurm_env(slot: Slot, task: int, tasks: int) -> dict[str, str]:
    """The task variables `srun --nodes=N` of the whole layout gives task `task` of `tasks`
    (a rank runs as a step of its own, whose one task would otherwise read 1 of 1)."""
    return {
        "SLURM_NTASKS": str(tasks),
        "SLURM_NPROCS": str(tasks),
        "SLURM_STEP_NUM_TASKS": str(tasks),
        "SLURM_PROCID": str(task),
        "SLURM_LOCALID": str(slot.local_rank),
        "SLURM_NODEID": str(slot.node_rank),
        "SLURM_NNODES": str(len(slot.nodes)),
        "SLURM_STEP_NUM_NODES": str(len(slot.nodes)),
        "SLURM_GTIDS": ",".join(map(str, slot.node_ranks)),
        "SLURM_TASKS_PER_NODE": tasks_per_node(slot.per_node),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node(slot.per_node),
        "SLURM_NODELIST": hostlist(slot.nodes),
        "SLURM_STEP_NODELIST": hostlist(slot.nodes),
    }


def tasks_per_node(counts: Sequence[int]) -> str:
    """Slurm's form: runs of equal counts as `N(xK)`, e.g. (2, 2, 2, 1) -> `2(x3),1`."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return ",".join(f"{n}(x{k})" if k > 1 else str(n) for n, k in runs)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def hostlist(names: Sequence[str]) -> str:
    """Slurm's compressed host list, e.g. tg-host-0,tg-host-1,tg-host-2 -> tg-host-[0-2]
    (sorted, as Slurm prints a step's nodes)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in sorted(set(names)):
        m = _NUMBERED.match(name)
        if m is None:
            plain.append(name)
        else:
            digits = m.group(2)  # zero-padded numbers keep their width
            width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
            groups.setdefault((m.group(1), width), []).append(int(digits))
    parts = list(plain)
    for (prefix, width), numbers in groups.items():
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        ranges: list[str] = []
        for n in sorted(numbers):
            last = ranges[-1].split("-")[-1] if ranges else None
            if last is not None and int(last) + 1 == n:
                ranges[-1] = f"{ranges[-1].split('-')[0]}-{n:0{width}d}"
            else:
                ranges.append(f"{n:0{width}d}")
        parts.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(sorted(parts))
