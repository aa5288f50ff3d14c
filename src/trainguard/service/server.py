"""`trainguard server`: the Service's scheduling loop and the HTTP API in one process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from pathlib import Path

import uvicorn

from trainguard.backends.childwatch import pidfd_child_watcher
from trainguard.errors import SpecError
from trainguard.records.store import Store
from trainguard.service.api import create_app
from trainguard.service.config import TOKEN_FILE, ServerConfig, home_token
from trainguard.service.http_guard import Guard
from trainguard.service.scheduler import Service
from trainguard.storage.private import (
    PRIVATE_DIR,
    private_dir,
    replace_private,
    tighten,
)


def serve(config: ServerConfig, home: Path | None) -> int:
    """Run until SIGINT/SIGTERM. The masters of running jobs outlive the server."""
    sock = listen(config.host, config.port)  # first: a port in use stores nothing
    store = Store(home, config.db)
    store.home.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)  # logs live here, whatever the db
    tighten(private_dir(store.home / "jobs"))
    origin = "the token you gave"
    if config.token is None and config.require_token:
        config = config.model_copy(update={"token": home_token(store.home, create=True)})
        origin = f"the token in {store.home / TOKEN_FILE} (this user's CLI reads it)"
    service = Service(store, config)
    return asyncio.run(_serve(service, config, origin, sock))


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound (SpecError in one line if it cannot be: a port in use)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise SpecError([f"--host {host}: not an address to listen on ({exc})"]) from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        raise SpecError(
            [f"--port {port}: cannot listen on {host}:{port}: {why} (--port 0 picks a free one)"]
        ) from None
    return sock


async def _serve(
    service: Service, config: ServerConfig, token_origin: str, sock: socket.socket
) -> int:
    with pidfd_child_watcher(asyncio.get_running_loop()):  # no thread per job's master
        return await _serve_on(service, config, token_origin, sock)


async def _serve_on(
    service: Service, config: ServerConfig, token_origin: str, sock: socket.socket
) -> int:
    app = Guard(create_app(service), config.host, config.allowed_hosts)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    scheduler = asyncio.create_task(service.run())
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if serving.done():  # could not bind: uvicorn said why
        scheduler.cancel()
        return 1
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    url = f"http://{host}:{port}"
    info = service.store.home / "server.json"
    # Whole or absent: the CLI and the tests read it while it is written.
    replace_private(info, json.dumps({"url": url, "pid": os.getpid()}).encode())
    service.say(f"listening on {url} (store {service.store.engine.url.render_as_string()})")
    if config.token:
        service.say(f"requests need {token_origin}; the web page: {url}/#token=TOKEN")
    else:
        service.say("no token (--no-token): any local user can submit jobs")
    try:
        await serving
    finally:
        scheduler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await scheduler
        with contextlib.suppress(OSError):
            info.unlink()
    return 0
