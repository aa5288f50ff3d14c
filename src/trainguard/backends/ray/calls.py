"""The master's calls into a Ray cluster: bounded, and their failures in one line."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

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
