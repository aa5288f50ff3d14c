"""`trainguard server`: the Service's scheduling loop and the HTTP API in one process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import uvicorn

from trainguard.backends.childwatch import pidfd_child_watcher
from trainguard.records.store import Store
from trainguard.service.api import create_app
from trainguard.service.config import TOKEN_FILE, ServerConfig, home_token
from trainguard.service.http_guard import Guard
from trainguard.service.scheduler import Service


def serve(config: ServerConfig, home: Path | None) -> int:
    """Run until SIGINT/SIGTERM. The masters of running jobs outlive the server."""
    store = Store(home, config.db)
    store.home.mkdir(parents=True, exist_ok=True)  # logs live here whatever the database
    origin = "the token you gave"
    if config.token is None and config.require_token:
        config = config.model_copy(update={"token": home_token(store.home, create=True)})
        origin = f"the token in {store.home / TOKEN_FILE} (this user's CLI reads it)"
    service = Service(store, config)
    return asyncio.run(_serve(service, config, origin))


async def _serve(service: Service, config: ServerConfig, token_origin: str) -> int:
    with pidfd_child_watcher(asyncio.get_running_loop()):  # no thread per job's master
        return await _serve_on(service, config, token_origin)


async def _serve_on(service: Service, config: ServerConfig, token_origin: str) -> int:
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
    serving = asyncio.create_task(server.serve())
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if serving.done():  # could not bind: uvicorn said why
        scheduler.cancel()
        return 1
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    url = f"http://{host}:{port}"
    info = service.store.home / "server.json"
    info.write_text(json.dumps({"url": url, "pid": os.getpid()}))
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
