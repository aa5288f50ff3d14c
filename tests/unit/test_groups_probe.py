"""The services' readiness probe (master/groups.py): an error of the master's own machine
(EMFILE here, made real by lowering this process's file limit) is the master's internal
error, raised, never a service that does not listen (issue 37)."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import socket

import pytest

from trainguard.backends.net import free_port
from trainguard.master.groups import not_listening


def test_a_listening_service_is_found_and_a_closed_port_is_missing() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        up = ("127.0.0.1", int(server.getsockname()[1]))
        down = ("127.0.0.1", free_port())
        assert asyncio.run(not_listening([up, down])) == [down]


async def _probe_without_descriptors(endpoint: tuple[str, int]) -> list[tuple[str, int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest_free = os.dup(0)
    os.close(lowest_free)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor left
    try:
        return await not_listening([endpoint])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_masters_own_emfile_is_an_internal_error_not_a_silent_service() -> None:
    endpoint = ("127.0.0.1", free_port())
    with pytest.raises(OSError) as raised:
        asyncio.run(_probe_without_descriptors(endpoint))
    assert raised.value.errno == errno.EMFILE
    assert f"probing the service at 127.0.0.1:{endpoint[1]}" in str(raised.value)
    assert "EMFILE" in str(raised.value)
