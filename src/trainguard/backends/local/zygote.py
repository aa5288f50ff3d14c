"""Warm start (`--preload torch`): fork replicas from an interpreter that already imported
the heavy modules, so a restart skips the import.

The zygote is a child of the master that imports the listed modules once, checks that no
thread is alive (forking a threaded process is unsafe), and then waits for requests on a
Unix socket. For each Python replica it forks: the child starts its own
session, dies with the zygote (PR_SET_PDEATHSIG), takes the master's pipe as its stdout
and stderr, gets a clean environment and working directory, and runs its program (a
script, `-m module` or `-c code`) as `__main__`, with the sys.argv and sys.path[0] the
interpreter would have given it. The zygote reports each child's pid and, when it
reaps it, its exit status. It also forks the job's rendezvous keeper (`rendezvous_keeper`).

Messages are JSON lines; the pipe's write end travels with a request as SCM_RIGHTS.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainguard.backends.local.rendezvous_keeper import RendezvousKeeper, keep
from trainguard.backends.local.replica_init import become_replica, die_with_parent

PRESETS: dict[str, tuple[str, ...]] = {
    # What DDP needs, for a job of several ranks, with torch._dynamo, which DDP's
    # constructor imports lazily (~0.7 s in every rank, most of a warm restart). Imported
    # before any process group exists, it leaves torch.distributed.nn.functional's group
    # defaults unbound, and gloo ranks deadlocked at exit; `import_order` binds them in
    # each forked replica as a cold import after init_process_group would have.
    "torch": (
        "torch",
        "torch.distributed",
        "torch.nn.parallel",
        "sympy",
        "torch.fx",
        "networkx",
        "torch._dynamo",
    ),
}
"""What a preload name imports for a distributed job; any other name is imported as it is."""


def expand(modules: Sequence[str], distributed: bool = True) -> list[str]:
    """The modules to import for `modules`: a preset's whole list for a job of several
    replicas, its first module alone for a single one."""
    out: list[str] = []
    for name in modules:
        preset = PRESETS.get(name, (name,))
        for mod in preset if distributed else preset[:1]:
            if mod not in out:
                out.append(mod)
    return out


def _accelerator_in_use() -> str | None:
    """What the imports started on a device: a forked child cannot use a CUDA context its
    parent made, so the zygote must never hold one."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA"
    return None


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


# ---------------------------------------------------------------- the zygote process


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall((json.dumps(msg) + "\n").encode())


def main(modules: Sequence[str], fd: int) -> None:
    """The zygote's loop: import, report, then fork on request and report exits."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C is the master's to handle
    sock = socket.socket(fileno=fd)
    t0 = time.monotonic()
    for name in modules:
        importlib.import_module(name)
    threads = _threads()
    accelerator = _accelerator_in_use()
    _send(
        sock,
        {
            "ready": threads == 1 and accelerator is None,
            "threads": threads,
            "accelerator": accelerator,
            "import_s": time.monotonic() - t0,
        },
    )
    if threads != 1 or accelerator is not None:
        return  # forking now would copy locks other threads hold, or a device context
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    buf = b""
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(sock)
                continue
            msg, fds, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(4 * 8))
            if not msg:
                return  # the master is gone
            received = _fds(fds)
            buf += msg
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                out_fd = received.pop(0)
                pid = os.fork()
                if pid == 0 and req.get("keeper"):
                    keep((sock.fileno(), wake_r, wake_w), out_fd)
                elif pid == 0:
                    become_replica(sock, wake_r, wake_w, req, out_fd)
                os.close(out_fd)
                _send(sock, {"id": req["id"], "pid": pid})
        _reap(sock)


def _fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
            fds.extend(arr)
    return fds


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


# ---------------------------------------------------------------- the master's side


class ZygoteError(Exception):
    """The zygote could not start or is gone; replicas start the ordinary way."""


class Zygote:
    def __init__(self, proc: asyncio.subprocess.Process, sock: socket.socket) -> None:
        self._proc = proc
        self._sock = sock
        self._buf = b""
        self._next = 0
        self._pending: dict[int, asyncio.Future[int]] = {}
        self.on_exit: Callable[[int, int], None] = lambda _pid, _code: None
        # Its death (SIGKILL, the OOM killer: it holds the preloaded modules) takes every
        # replica it forked along (PR_SET_PDEATHSIG), and no exit of theirs will come:
        # called once with its own exit status, so that they are reported exited.
        self.on_death: Callable[[int], None] = lambda _code: None
        self._closing = False
        self._death: asyncio.Task[None] | None = None
        self.import_s = 0.0
        self.alive = True
        self.env: dict[str, str] = {}  # the environment it imported in (startup_env_differs)
        self.helpers: set[int] = set()  # pids it forked that are not replicas (the keeper)

    @classmethod
    async def start(
        cls,
        modules: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout_s: float = 120.0,
        distributed: bool = True,
    ) -> Zygote:
        """Start a zygote importing `modules` (see `expand`) in `env` (the replicas' common
        environment: what a library reads when imported is what the replicas would give it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = "import sys; from trainguard.backends.local.zygote import main; " + (
            f"main({expand(modules, distributed)!r}, {theirs.fileno()})"
        )
        # numpy's OpenBLAS starts its worker threads at import; one thread keeps the zygote
        # single-threaded (forkable). Replicas then run numpy's BLAS on one thread; torch's
        # own thread pools start after the fork, in each replica, as usual.
        base = dict(os.environ if env is None else env)
        env = {**base, "OPENBLAS_NUM_THREADS": base.get("OPENBLAS_NUM_THREADS", "1")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code,
            pass_fds=(theirs.fileno(),),
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
        theirs.close()
        loop = asyncio.get_running_loop()
        ours.setblocking(False)
        try:
            line = await asyncio.wait_for(_readline(loop, ours), timeout_s)
        except (TimeoutError, OSError, ValueError) as exc:
            proc.kill()
            raise ZygoteError(f"the preload process did not start: {exc!r}") from None
        hello = json.loads(line)
        if not hello.get("ready"):
            proc.kill()
            what = (
                f"initialised {hello['accelerator']}"
                if hello.get("accelerator")
                else f"left {hello.get('threads')} threads alive"
            )
            raise ZygoteError(
                f"importing {', '.join(modules)} {what}: forking from it would not be safe"
            )
        z = cls(proc, ours)
        z.env = base
        z.import_s = float(hello["import_s"])
        loop.add_reader(ours.fileno(), z._readable)
        return z

    def _readable(self) -> None:
        try:
            data = self._sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._gone()
            if not self._closing and self._death is None:
                self._death = asyncio.get_running_loop().create_task(self._died())
            return
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if "exit" in msg and int(msg["exit"]) in self.helpers:
                self.helpers.discard(int(msg["exit"]))
            elif "exit" in msg:
                self.on_exit(int(msg["exit"]), int(msg["code"]))
            elif "id" in msg:
                fut = self._pending.pop(int(msg["id"]), None)
                if fut is not None and not fut.done():
                    fut.set_result(int(msg["pid"]))

    async def _died(self) -> None:
        self.on_death(await self._proc.wait())

    def _gone(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ZygoteError("the preload process is gone"))
        self._pending.clear()

    async def spawn(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        cwd: str,
        out_fd: int,
        cgroup: str | Sequence[str] | None = None,
    ) -> int:
        """Fork a replica writing to `out_fd` (first joining the cgroups whose `cgroup.procs`
        are `cgroup`, if given); returns its pid."""
        joins = [cgroup] if isinstance(cgroup, str) else list(cgroup or ())
        req = {"argv": list(argv), "env": env, "cwd": cwd, "cgroup": joins}
        return await self._fork(req, out_fd)

    async def keeper(self) -> RendezvousKeeper:
        """Fork the job's rendezvous store keeper and wait until it can open stores."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            pid = await self._fork({"keeper": True}, theirs.fileno())
        except ZygoteError:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self.helpers.add(pid)
        keeper = RendezvousKeeper(ours, pid)
        try:
            await keeper.ready()
        except BaseException:
            keeper.close()
            raise
        return keeper

    async def _fork(self, req: dict[str, Any], fd: int) -> int:
        if not self.alive:
            raise ZygoteError("the preload process is gone")
        self._next += 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[self._next] = fut
        msg = json.dumps({"id": self._next, **req}) + "\n"
        fds = array.array("i", [fd])
        self._sock.setblocking(True)
        try:
            self._sock.sendmsg(
                [msg.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())]
            )
        except OSError as exc:
            self._pending.pop(self._next, None)
            raise ZygoteError(f"the preload process is gone: {exc}") from None
        finally:
            self._sock.setblocking(False)
        return await fut

    async def close(self) -> None:
        self._closing = True
        self._gone()
        with contextlib.suppress(OSError):
            self._sock.close()
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        await self._proc.wait()
        if self._death is not None:  # a death seen before: it is still reported
            await self._death


async def _readline(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    buf = b""
    while b"\n" not in buf:
        chunk = await loop.sock_recv(sock, 4096)
        if not chunk:
            raise ValueError("closed before it said it was ready")
        buf += chunk
    line, _ = buf.split(b"\n", 1)
    return line
