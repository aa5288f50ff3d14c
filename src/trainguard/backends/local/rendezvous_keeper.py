"""The rendezvous store of a job's attempts, held outside its replicas (issue 16).

By default rank 0 of a torch job hosts the TCPStore the ranks meet at, and a rank that
connects before rank 0 listens is refused and backs off ~0.6 s before it tries again (two
forked ranks, rank 0 50 ms late: 0.62 s in init_process_group against 0.016 s on time). A
warm restart is won or lost on that race. torchrun hosts the store in its agent and tells
the workers `TORCHELASTIC_USE_AGENT_STORE=True`, so every rank is a client of a store that
already listens; the keeper does the same. It is a child of the zygote (torch is imported
there already, and the zygote itself must stay single-threaded), opens one TCPStore per
attempt on the port the master names (or one it picks) and keeps the newest `KEEP` open: a
replica restarted alone still finds its attempt's store. It dies with the zygote.

Messages are JSON lines on a socket pair: `{"host": h, "port": p}` -> `{"port": p}` or
`{"error": why}`; the keeper says `{"ready": true}` (or an error) once torch.distributed is
imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from typing import Any

from trainguard.backends.local.replica_init import die_with_parent

KEEP = 2
"""Stores kept open: the current attempt's and the one before (its ranks may still be
going away)."""

TIMEOUT_S = 10.0
"""How long the master waits for the keeper to answer before it does without it."""


class KeeperError(Exception):
    """The keeper could not open a store, or is gone: rank 0 hosts it, as usual."""


# ---------------------------------------------------------------- the keeper process


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall((json.dumps(msg) + "\n").encode())


def keep(closing: tuple[int, ...], fd: int) -> None:
    """In the child the zygote forked: close the zygote's descriptors (`closing`), then
    serve store requests on `fd` until the master hangs up. Never returns."""
    code = 0
    try:
        die_with_parent()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for other in closing:
            os.close(other)
        sock = socket.socket(fileno=fd)
        _serve(sock)
    except BaseException:
        code = 1
    os._exit(code)


def _serve(sock: socket.socket) -> None:
    from datetime import timedelta

    try:
        from torch.distributed import TCPStore  # type: ignore[attr-defined]
    except Exception as exc:
        _send(sock, {"error": f"torch.distributed does not import: {exc!r}"})
        return
    _send(sock, {"ready": True})
    stores: list[Any] = []
    with sock.makefile("rb") as lines:
        for line in lines:
            req = json.loads(line)
            try:
                store = TCPStore(
                    req["host"],
                    int(req.get("port", 0)),
                    None,
                    True,
                    timedelta(seconds=60),
                    wait_for_workers=False,
                )
            except Exception as exc:
                _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
                continue
            stores.append(store)
            del stores[:-KEEP]
            _send(sock, {"port": int(store.port)})


# ---------------------------------------------------------------- the master's side


class RendezvousKeeper:
    """The master's end of a keeper: `open` asks for a fresh store."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self.pid = pid
        self.alive = True
        self._buf = b""
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        """Wait for the keeper to say it can open stores."""
        msg = await self._reply()
        if not msg.get("ready"):
            self.alive = False
            raise KeeperError(str(msg.get("error", msg)))

    async def open(self, host: str, port: int = 0) -> int:
        """A new store listening on `host:port` (port 0: one the keeper picks); its port."""
        if not self.alive:
            raise KeeperError("the store keeper is gone")
        async with self._lock:
            loop = asyncio.get_running_loop()
            try:
                await loop.sock_sendall(
                    self._sock, (json.dumps({"host": host, "port": port}) + "\n").encode()
                )
            except OSError as exc:
                self.alive = False
                raise KeeperError(f"the store keeper is gone: {exc}") from None
            msg = await self._reply()
        if "port" not in msg:
            raise KeeperError(str(msg.get("error", msg)))
        return int(msg["port"])

    async def _reply(self) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        try:
            while b"\n" not in self._buf:
                chunk = await asyncio.wait_for(loop.sock_recv(self._sock, 4096), TIMEOUT_S)
                if not chunk:
                    raise KeeperError("the store keeper is gone")
                self._buf += chunk
        except (TimeoutError, OSError) as exc:
            self.alive = False
            raise KeeperError(f"the store keeper did not answer: {exc!r}") from None
        except KeeperError:
            self.alive = False
            raise
        line, self._buf = self._buf.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        self.alive = False
        self._sock.close()
