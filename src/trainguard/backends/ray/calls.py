"""The master's calls into a Ray cluster: bounded, and their failures in one line."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from trainguard.backends.ray.exit_probe import PROBE_S, absent
from trainguard.classify.readings import MachineReading, from_json

CALL_S = 10.0  # a control call (signal, where) that takes longer: the node is gone


async def bounded(aw: Any, timeout_s: float) -> Any:
    """Await a Ray call, or raise TimeoutError after `timeout_s`."""
    return await asyncio.wait_for(aw, timeout_s)


def label(node: Mapping[str, str]) -> str:
    """How a node is named in records: its address and the start of its Ray id."""
    return f"{node['ip']}/{node['node_id'][:12]}"


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of what it says."""
    text = str(exc).strip().splitlines()
    first = next((t for t in text if t.strip()), "")
    return f"{type(exc).__name__}: {first[:300]}"


async def node_readings(actor: Any, node: str) -> tuple[MachineReading, ...]:
    """What a failed replica's node read of its machine (its host actor's probes); a node
    that does not answer gives one absent reading, never a guess."""
    try:
        text = await bounded(actor.machine.remote(PROBE_S), PROBE_S + CALL_S)
    except Exception as exc:  # its actor or node is gone, or it did not answer in time
        why = "no answer" if isinstance(exc, TimeoutError) else one_line(exc)
        return (absent(f"node {node}: its readings did not come ({why})"),)
    return from_json(text if isinstance(text, str) else None)
