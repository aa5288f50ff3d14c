"""The moves a job and a replica may make, from the table the master checks each move
against (`trainguard.states`: `JOB_MOVES`, `REPLICA_MOVES`), so the page cannot list a
move the code refuses, or leave out one it makes."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TypeVar

from refmd import code, table

from trainguard.states import JOB_MOVES, REPLICA_MOVES

S = TypeVar("S", bound=Enum)


def moves(graph: Mapping[S, frozenset[S]]) -> str:
    """A row per state: where it may go (in the enum's order), or that it is final."""
    rows = []
    for state, targets in graph.items():
        order = list(type(state))
        to = sorted(targets, key=order.index)
        rows.append([code(state.value), ", ".join(code(t.value) for t in to) or "(final)"])
    return table(["from", "may go to"], rows)


def render_jobs() -> str:
    return moves(JOB_MOVES)


def render_replicas() -> str:
    return moves(REPLICA_MOVES)
