"""One machine as one node (issue 37): the GPUs the master handed each rank are laid out
as torchrun lays out a node's, so `torch.cuda.set_device(LOCAL_RANK)` picks the rank's own.

The master hands each replica its own ids (`policy.gpus`); torchrun instead shows every
rank of a node all the node's GPUs, and nearly every script then reads `cuda:LOCAL_RANK`,
which on a one-id list fails on every rank but 0. The layout is `frameworks.node_env`'s
(the one Slurm and Ray use), over the attempt's launches with every replica on one node;
a replica restarted alone is laid out among the others' launches of the same attempt, so
its own GPU stays at its LOCAL_RANK. Only for the local backend as the job's backend:
under Slurm its launches are srun steps, laid out already. A replica whose ids the master
did not hand out (none asked; a pool env that sets `CUDA_VISIBLE_DEVICES` itself) keeps
what it has.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from trainguard.backends.interface import Launch
from trainguard.backends.launched import Launched
from trainguard.frameworks.node_env import DEVICES, OWN_DEVICES, id_list, placed_envs

_NODE = "localhost"


def without_own(launch: Launch) -> Launch:
    """The launch without the master's note of its own ids (no process sees it)."""
    if OWN_DEVICES not in launch.env:
        return launch
    return replace(launch, env={k: v for k, v in launch.env.items() if k != OWN_DEVICES})


class NodeLayout:
    """The current attempt's launches, to lay out those started (all, or one alone)."""

    def __init__(self) -> None:
        self._launched = Launched()

    def apply(self, launches: Sequence[Launch]) -> list[Launch]:
        if not launches:
            return []
        launched = self._launched.add(launches)
        own = {
            r: id_list(la.env.get(OWN_DEVICES))
            for r, la in launched.items()
            if "LOCAL_RANK" in la.env  # a torchrun rank: the only kind that reads it
        }
        ranks = {r: (la.rank, la.env) for r, la in launched.items()}
        changes = placed_envs(ranks, dict.fromkeys(ranks, _NODE), own)
        out = []
        for la in launches:
            devices = changes.get(la.replica, {}).get(DEVICES)
            la = without_own(la)
            out.append(la if devices is None else replace(la, env={**la.env, DEVICES: devices}))
        return out
