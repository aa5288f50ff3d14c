"""What runs on a Ray node for one replica: start its command, hand over its output, stop it.

`ReplicaHost` is a plain class; the Ray backend turns it into an actor placed in the
attempt's placement group. It imports nothing from Ray at module level, so it loads fast
on a node and can be tested as an ordinary object. When the actor dies (ray.kill, its
driver or its node gone), PR_SET_PDEATHSIG takes the replica and the same guardian as
locally takes the rest of its process group. Where the node has a zygote (the warm start,
`node_zygote`), the replica is forked by it instead: its output comes through a FIFO, its
exit status from the zygote (its parent), and the guardian still takes its group.

What a replica starts outside its group (a new session, a double-forked daemon) is fenced
as locally (`backends.local.tracking`): each run lives in a cgroup of its own, joined
before its program runs, so its exit, a stop, a restart and the actor's end (the guardian
sweeps the actor's cgroups) take every process of it; where no cgroup may be made, the
actor is a subreaper and the guardian's token marks what the run started.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainguard.backends.guardian import TOKEN_ENV, Guardian
from trainguard.backends.local.tracking import RunProcesses, Tracking
from trainguard.backends.net import free_port
from trainguard.backends.ray.exit_probe import ExitProbe, seen_here
from trainguard.backends.storage_check import storage_problem
from trainguard.storage.env import ENV_FAULTHANDLER_FILE

# The GPUs of every rank on this node (`frameworks.node_env`), from the backend: the
# replica's CUDA_VISIBLE_DEVICES, over the actor's own ids.
NODE_DEVICES_ENV = "TRAINGUARD_NODE_DEVICES"

_PR_SET_PDEATHSIG = 1
_CHUNK = 64 * 1024
_DRAIN_S = 1.0  # how long its last output may take to come once its run is ended


def child_setup(procs_file: str | None) -> Callable[[], None]:
    """In the child, before exec: join the run's cgroup (so its program starts inside), and
    die if the actor's process dies (ray.kill, node loss)."""

    def setup() -> None:
        if procs_file is not None:
            with contextlib.suppress(OSError), open(procs_file, "w") as fh:
                fh.write(str(os.getpid()))
        with contextlib.suppress(OSError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return setup


def _ray_gpu_ids() -> list[Any]:
    """The GPUs Ray assigned to this actor (none outside a Ray worker)."""
    try:
        import ray

        return list(ray.get_gpu_ids()) if ray.is_initialized() else []
    except Exception:
        return []


def _local_stacks_file(env: dict[str, str]) -> str | None:
    """The replica's stack-dump file: the master's path where this node sees the master's
    log folder (one machine); else a file of this node's own, which `dump_stacks` reads here."""
    path = env.get(ENV_FAULTHANDLER_FILE)
    if not path or os.path.isdir(os.path.dirname(path)):
        return None
    mine = Path(tempfile.gettempdir(), "trainguard-stacks", f"actor-{os.getpid()}")
    mine.mkdir(parents=True, exist_ok=True)
    local = mine / f"{Path(path).parent.name}-{Path(path).name}"
    env[ENV_FAULTHANDLER_FILE] = str(local)
    return str(local)


class ReplicaHost:
    def __init__(self) -> None:
        self._guardian: Guardian | None = None  # kills the replica's group if this actor dies
        self._pid: int | None = None
        self._wait: Callable[[float], int | None] = lambda _t: None  # its exit status
        self._buf = bytearray()
        self._eof = False
        self._cond = threading.Condition()
        self._stacks: str | None = None  # where its replica dumps stacks, on this node
        self._tracking: Tracking | None = None  # every process of each run (cgroup)
        self._run: RunProcesses | None = None  # those of the current run
        self._code: int | None = None  # its exit status, once known
        self._probe = ExitProbe()  # the machine's readings at a failed exit
        self._stopping = False  # the master asked it to stop: its exit is no failure

    def where(self) -> dict[str, str]:
        """This node: its Ray id, IP address and host name, and the GPU ids Ray gave this
        actor there (comma-separated; empty for none)."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "host": socket.gethostname(),
            "gpus": ",".join(str(g) for g in _ray_gpu_ids()),
        }

    def free_port(self) -> int:
        return free_port("")

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        zygote: Any = None,
        paths: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Start the replica in its own process group, forked from the node's `zygote`
        (a `NodeZygote` actor) where it may be; {"pid": N, "cold": why-not-forked},
        or {"error": why}. `paths`: the job's (log, checkpoint folders), read at a failure.

        Refused when this node does not see the job's checkpoint storage (the master's
        marker): a replica there would find no checkpoint and start again from step 0."""
        env = dict(env)
        problem = storage_problem(env)
        if problem:
            return {"error": problem}
        self._stacks = _local_stacks_file(env)
        gpus = _ray_gpu_ids()
        node_gpus = env.pop(NODE_DEVICES_ENV, "")
        if node_gpus:  # the GPUs of this node's ranks, in local-rank order (as torchrun)
            env["CUDA_VISIBLE_DEVICES"] = node_gpus
        elif gpus:  # what Ray gave this actor, not what the master's machine has
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        with self._cond:
            self._buf.clear()
            self._eof = False
        self._code = None
        self._stopping = False
        self._probe = ExitProbe(seen_here(paths, self._stacks and os.path.dirname(self._stacks)))
        self._end_run()  # a run still here (a restart before its exit was read) ends now
        self._pid = None
        guardian, tracking = self._fence()
        env[TOKEN_ENV] = guardian.token  # what a run orphans carries it (the fallback)
        run = self._run = tracking.new_run()
        cold = "no preload process on this node" if zygote is None else None
        info = self._fork(zygote, argv, env, cwd, run) if zygote is not None else {}
        if "pid" not in info and "error" not in info:
            cold = info.get("cold", cold)
            info = self._spawn(argv, env, cwd, run)
        if "pid" not in info:
            self.close()  # nothing of this actor runs: no guardian either, until one does
            return info
        run.add(int(info["pid"]))  # the tree's root (inside already: joined before exec)
        guardian.watch(int(info["pid"]))  # PDEATHSIG reaches only the direct child
        return {**info, "cold": cold}

    def _fence(self) -> tuple[Guardian, Tracking]:
        """The guardian and the run tracking, made at the first start."""
        if self._guardian is None:
            self._guardian = Guardian(detach=True)  # Ray kills an exiting actor's children
        if self._tracking is None:
            self._tracking = Tracking(self._guardian.token, TOKEN_ENV)
            if self._tracking.cgroups is not None:
                self._guardian.sweep_cgroups(str(self._tracking.cgroups.folder))
            else:
                self._guardian.sweep_token()
        return self._guardian, self._tracking

    def _end_run(self) -> None:
        """Kill every process left of the current run (its cgroup, or what it orphaned)."""
        run, self._run = self._run, None
        if run is not None:
            asyncio.run(run.kill())
            run.remove()
        if self._tracking is not None:
            asyncio.run(self._tracking.sweep())

    def _spawn(
        self, argv: Sequence[str], env: dict[str, str], cwd: str, run: RunProcesses
    ) -> dict[str, Any]:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=child_setup(run.procs_file),
            )
        except FileNotFoundError:
            where = "working directory" if not os.path.isdir(cwd) else "command"
            what = cwd if where == "working directory" else argv[0]
            return {"error": f"{where} not found on this node: {what!r}"}
        except OSError as exc:
            return {"error": f"cannot start {argv[0]!r}: {exc.strerror or exc}"}
        assert proc.stdout is not None
        self._pid = proc.pid

        def wait(timeout_s: float) -> int | None:
            try:
                return proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return None

        self._wait = wait
        self._pump_from(proc.stdout.fileno(), proc.stdout.close)
        return {"pid": proc.pid}

    def _fork(
        self, zygote: Any, argv: Sequence[str], env: dict[str, str], cwd: str, run: RunProcesses
    ) -> dict[str, Any]:
        """Ask the node's zygote to fork the replica; its output comes through a FIFO."""
        import ray

        fifo = Path(tempfile.mkdtemp(prefix="trainguard-out-")) / "out"
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # open before the writer: no block
        try:
            info: dict[str, Any] = ray.get(
                zygote.spawn.remote(list(argv), env, cwd, str(fifo), run.procs_file)
            )
        except Exception as exc:  # the zygote's actor is gone: start the ordinary way
            info = {"cold": f"the node's preload process is gone ({type(exc).__name__})"}
        finally:
            fifo.unlink()
            fifo.parent.rmdir()
        if "pid" not in info:
            os.close(fd)
            return info
        pid = self._pid = int(info["pid"])
        os.set_blocking(fd, True)

        def wait(timeout_s: float) -> int | None:
            try:
                code = ray.get(zygote.exit_code.remote(pid, timeout_s))
            except Exception:  # its zygote (and with it the replica) is gone
                return -signal.SIGKILL
            return None if code is None else int(code)

        self._wait = wait
        self._pump_from(fd, lambda: os.close(fd))
        return info

    def _pump_from(self, fd: int, close: Callable[[], None]) -> None:
        def pump() -> None:
            while True:
                try:
                    data = os.read(fd, _CHUNK)
                except OSError:
                    data = b""
                with self._cond:
                    if data:
                        self._buf += data
                    else:
                        self._eof = True
                    self._cond.notify_all()
                if not data:
                    close()
                    return

        threading.Thread(target=pump, daemon=True).start()

    def read(self, timeout_s: float) -> tuple[bytes, int | None]:
        """What it printed since the last read (waiting up to `timeout_s` for something),
        and its exit status once it has exited and everything was read. Its exit ends
        the rest of its run, a process that holds its output included (then its end of
        file comes)."""
        pid = self._pid
        if pid is None:
            return b"", None
        with self._cond:
            self._cond.wait_for(lambda: bool(self._buf) or self._eof, timeout_s)
            data, self._buf = bytes(self._buf), bytearray()
            eof = self._eof
        if data:
            return data, None
        if self._code is None:
            code = self._wait(timeout_s if eof else 0)
            if code is None:
                return b"", None  # it still runs
            self._code = code
            if code and not self._stopping:  # before its cgroup goes; the rest in a thread
                self._probe.begin(pid, self._run)
            self.signal(signal.SIGKILL)  # whatever it left behind in its group goes with it
            self._end_run()  # and what left the group (a new session, a daemon)
            if self._guardian is not None:
                self._guardian.forget(pid)
            with self._cond:  # what they still held of its output
                self._cond.wait_for(lambda: self._eof, _DRAIN_S)
                data, self._buf = bytes(self._buf), bytearray()
            if data:
                return data, None
        return b"", self._code

    def close(self) -> None:
        """End the run and stop the guardian: what it still watches goes with it (the
        actor's end)."""
        if self._pid is not None and self._code is None and self.signal(signal.SIGKILL):
            self._code = self._wait(_DRAIN_S)  # reaped, where it is our child
        self._end_run()
        if self._tracking is not None:
            asyncio.run(self._tracking.close())
            self._tracking = None
        if self._guardian is not None:
            self._guardian.sweep_token(False)  # nothing of ours is left to look for
            self._guardian.close()
            self._guardian = None

    def machine(self, timeout_s: float) -> str | None:
        """What this node's machine said at the replica's failed exit, as JSON (waiting up
        to `timeout_s` for the probes); None where it exited well or was stopped."""
        return self._probe.result(timeout_s)

    def signal(self, signum: int, stop: bool = False) -> bool:
        """Send `signum` to the replica's group and to every process of its run outside
        it (a stop's TERM, CONT and KILL reach what left the group too). `stop`: the
        master stops it (its exit is not read as a failure)."""
        self._stopping = self._stopping or stop
        pid = self._pid
        if pid is None:
            return False
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        finally:
            if self._run is not None:
                self._run.signal(signum, but_group=pid)
        return True

    def dump_stacks(
        self, targets: Sequence[tuple[str, int, int]], timeout_s: float, files: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """py-spy on this node (the same code as locally), as plain dicts."""
        from trainguard.hangs.stack_dumps import dump_stacks

        if self._stacks:  # the file is on this node, not where the master keeps its logs
            files = dict.fromkeys(files, self._stacks)
        snaps = asyncio.run(
            dump_stacks(
                targets,
                timeout_s=timeout_s,
                faulthandler_files={k: Path(v) for k, v in files.items()},
            )
        )
        return [s.to_dict() for s in snaps]
