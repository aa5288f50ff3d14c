"""Addresses on this machine: a free TCP port for a rendezvous or a task's own address."""

from __future__ import annotations

import asyncio
import contextlib
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def listens(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts a TCP connection at host:port now."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
