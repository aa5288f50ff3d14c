"""Warm start on Ray: one zygote per node, held by a node-level actor that outlives attempts.

The local warm start (`backends.local.zygote`) forks replicas from an interpreter that
imported torch once. On a Ray cluster the replica host actors live as long as their
placement; the zygote must live longer, so a restart on a surviving node forks at once:
`NodeZygote` is an async actor pinned to its node (no cpus: it runs nothing itself),
made when a job first places a replica there and killed with the job. The replica host
(`host.ReplicaHost`, on the same node) asks it to fork; the replica's output reaches the
host through a FIFO on the node (the host opens the read end first; the zygote's child
gets the write end), and its exit status through `exit_code`, since the zygote, not the
host, is its parent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Sequence
from typing import Any

from trainguard.backends.local.python_cmd import parse, startup_env_differs
from trainguard.backends.local.rendezvous_keeper import KeeperError, RendezvousKeeper
from trainguard.backends.local.zygote import Zygote, ZygoteError


class NodeZygote:
    def __init__(self) -> None:
        self._zygote: Zygote | None = None
        self._keeper: RendezvousKeeper | None = None  # holds the rendezvous stores of rank 0 here
        self._exits: dict[int, int] = {}
        self._exited: dict[int, asyncio.Event] = {}  # pid -> set when it has exited

    async def ready(
        self, modules: Sequence[str], env: dict[str, str], distributed: bool
    ) -> dict[str, Any]:
        """Start the zygote (import `modules` in `env`); {"import_s": s} or {"error": why}."""
        try:
            self._zygote = await Zygote.start(modules, env, distributed=distributed)
        except ZygoteError as exc:
            return {"error": str(exc)}
        self._zygote.on_exit = self._on_exit
        return {"import_s": self._zygote.import_s}

    def _on_exit(self, pid: int, code: int) -> None:
        self._exits[pid] = code
        self._exited.setdefault(pid, asyncio.Event()).set()

    async def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        cwd: str,
        fifo: str,
        cgroup: str | None = None,
    ) -> dict[str, Any]:
        """Fork a replica whose output goes to `fifo` (first joining the run's cgroup whose
        `cgroup.procs` is `cgroup`): {"pid": N}, or {"cold": why} when it must start the
        ordinary way (no zygote, another interpreter, PYTHON* differing)."""
        zygote = self._zygote
        if zygote is None or not zygote.alive:
            return {"cold": "the node's preload process is gone"}
        cmd = parse(argv, env.get("PATH"))
        why = cmd if isinstance(cmd, str) else startup_env_differs(zygote.env, env)
        if why is not None:
            return {"cold": why}
        if not os.path.isdir(cwd):
            return {"error": f"working directory not found on this node: {cwd!r}"}
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # the host holds the read end open
        os.set_blocking(fd, True)
        try:
            return {"pid": await zygote.spawn(argv, env, cwd, fd, cgroup=cgroup)}
        except ZygoteError as exc:
            return {"cold": str(exc)}
        finally:
            os.close(fd)

    async def open_store(self, host: str) -> int | None:
        """A port on `host` where a fresh rendezvous store already listens (the keeper,
        forked from the zygote, as locally: no rank is refused while rank 0 starts);
        None where there is no zygote or the keeper failed (rank 0 hosts it)."""
        zygote = self._zygote
        if zygote is None or not zygote.alive:
            return None
        try:
            if self._keeper is None or not self._keeper.alive:
                self._keeper = await zygote.keeper()
            return await self._keeper.open(host)
        except (ZygoteError, KeeperError):
            return None

    async def exit_code(self, pid: int, timeout_s: float) -> int | None:
        """The exit status of a replica it forked, waiting up to `timeout_s`; None if it
        still runs."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.setdefault(pid, asyncio.Event()).wait(), timeout_s)
        if pid in self._exits:
            self._exited.pop(pid, None)
        return self._exits.pop(pid, None)

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
        if self._zygote is not None:
            await self._zygote.close()
            self._zygote = None
