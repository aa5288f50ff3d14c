"""Addresses on this machine: a free TCP port for a rendezvous or a task's own address."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import random
import socket

QUIET_PORTS = (20000, 32767)
"""Where a port for a replica to bind is drawn: below Linux's ephemeral range (32768-60999
by default), which the kernel hands to every outgoing connection and every bind to port 0
(srun's and gloo's among them), so a port it picked can be taken again before the replica
binds it (seen in CI: a rendezvous port lost to EADDRINUSE on a Slurm node)."""


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A port free at `host` now, from QUIET_PORTS where one is (else the kernel's pick).
    Raises OSError where `host` is not an address of this machine."""
    for _ in range(tries):
        port = random.randint(*QUIET_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue
                raise
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def connect_error(
    host: str, port: int, timeout_s: float = 0.5
) -> OSError | TimeoutError | None:
    """None if something accepts a TCP connection at host:port now, else what went wrong
    (which may be this process's own: EMFILE, the probe never left this machine)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError) as exc:
        return exc
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


def address_towards(addr: str) -> str:
    """The address of this host on the route to `addr` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return str(s.getsockname()[0])


def port_at(addr: str) -> int:
    """A free port where `addr` is this host's; on another node, one drawn from the same
    range (nothing here can test it there)."""
    with contextlib.suppress(OSError):
        return free_port(addr)
    return random.randint(*QUIET_PORTS)
