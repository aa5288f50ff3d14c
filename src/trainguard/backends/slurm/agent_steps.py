"""The node agents of a Slurm job (issue 40, `slurm.agents`): one `srun` step of one task
on each node the job may use (spares included, so a spare's zygote is warm before a node
is lost), running `trainguard.backends.agent.node` for the whole job. On the batch host
that is one srun per node, whatever the ranks per node, and a job's steps are its nodes.

The step overlaps the allocation's other steps (a node check still runs beside it) and,
as a step does by default since Slurm 21.08 (no `--exact`), has every CPU the job holds on
its node, so the ranks its agent forks are not confined to one; a step gets GRES (GPUs)
only when asked, so a GPU job names them in `slurm.srun_args` (`--gres=gpu:8`).
`--kill-on-bad-exit=0`: a step that ends takes no other node's agent with it. What srun
prints (its errors, the agent's last word) is kept, a few lines a node, to say why a
node's agent did not join."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from trainguard.backends.agent.protocol import TOKEN_ENV

SAID_LINES = 8
"""The last lines of each agent step's srun kept, to say why its agent did not join."""


def agent_argv(
    job_id: str, node: str, master: str, job: str, extra: Sequence[str] = ()
) -> list[str]:
    """The step of `node`'s agent, which dials the master at `master` (HOST:PORT)."""
    return [
        "srun",
        f"--jobid={job_id}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--unbuffered",
        "--export=ALL",
        "--job-name=trainguard-agent",
        *extra,
        sys.executable,
        "-m",
        "trainguard.backends.agent.node",
        master,
        job,
        node,
    ]


class AgentSteps:
    """The srun processes of the agents' steps, here beside the master, one per node."""

    def __init__(
        self,
        job_id: str,
        master: str,
        job: str,
        token: str,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._job_id, self._master, self._job = job_id, master, job
        self._extra = list(extra)
        self._env = {**(env if env is not None else os.environ), TOKEN_ENV: token}
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._said: dict[str, collections.deque[str]] = {}
        self._readers: set[asyncio.Task[Any]] = set()

    async def start(self, nodes: Sequence[str]) -> None:
        """A step on each of `nodes` that has none running."""
        for node in nodes:
            proc = self._procs.get(node)
            if proc is not None and proc.returncode is None:
                continue
            said = self._said[node] = collections.deque(maxlen=SAID_LINES)
            argv = agent_argv(self._job_id, node, self._master, self._job, self._extra)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    env=self._env,
                    start_new_session=True,  # the master's terminal signals are not its
                )
            except OSError as exc:
                said.append(f"srun could not start: {exc}")
                continue
            self._procs[node] = proc
            task = asyncio.ensure_future(self._read(proc, said))
            self._readers.add(task)
            task.add_done_callback(self._readers.discard)

    @staticmethod
    async def _read(proc: asyncio.subprocess.Process, said: collections.deque[str]) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            if text := line.decode("utf-8", "replace").strip():
                said.append(text)
        await proc.wait()
        said.append(f"(srun exited with status {proc.returncode})")

    def said(self, node: str) -> str:
        """What the node's step printed last, in one line ("" if nothing)."""
        return " | ".join(self._said.get(node, ()))

    def pids(self) -> dict[str, int]:
        """node -> the pid of its step's srun, while it runs."""
        return {n: p.pid for n, p in self._procs.items() if p.returncode is None}

    async def close(self, grace_s: float) -> None:
        """Each step ends when its agent does (told to close); srun is told to end one
        still running past `grace_s` (it signals its task), and killed 2 s later."""
        for signum, wait_s in (("terminate", grace_s), ("kill", 2.0)):
            running = [p for p in self._procs.values() if p.returncode is None]
            if not running:
                break
            await asyncio.wait([asyncio.ensure_future(p.wait()) for p in running], timeout=wait_s)
            for proc in running:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        getattr(proc, signum)()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in self._procs.values())), 2)
        for task in list(self._readers):
            task.cancel()
