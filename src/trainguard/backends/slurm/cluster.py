"""What the allocation is made of, asked of Slurm (`scontrol`), and whether a node answers.

The parsers and the reading of a probe are pure; the calls run Slurm's own client
commands, as a user would.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from trainguard.backends.net import connect_error
from trainguard.classify.own_errors import is_own_resource_errno, own_resource_text

SLURMD_PORT = 6818
"""slurmd's port unless slurm.conf says otherwise (`SlurmdPort`)."""
_BAD_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT", "MAINT", "UNKNOWN")


class SlurmError(Exception):
    """A Slurm command failed, or the allocation is not what a job can run in."""


@dataclass(frozen=True)
class Node:
    name: str
    addr: str
    state: str  # scontrol's State, e.g. IDLE, MIXED, DOWN*+NOT_RESPONDING
    port: int = SLURMD_PORT

    @property
    def usable(self) -> bool:
        """What Slurm itself says: not down, draining, failing or unreachable."""
        return not any(
            bad in self.state.upper() for bad in _BAD_STATES
        ) and not self.state.endswith("*")


def parse_node(line: str) -> Node | None:
    """One line of `scontrol -o show node`: `NodeName=n1 ... NodeAddr=10.0.0.2 ... State=IDLE`."""
    fields: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            fields.setdefault(key, value)
    name = fields.get("NodeName")
    if not name:
        return None
    port = fields.get("Port", "")
    return Node(
        name,
        fields.get("NodeAddr") or name,
        fields.get("State", "UNKNOWN"),
        int(port) if port.isdigit() else SLURMD_PORT,
    )


@dataclass(frozen=True)
class Allocation:
    """The Slurm job trainguard runs inside: its id and its nodes, in Slurm's order."""

    job_id: str
    nodes: tuple[str, ...]


def allocation_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(job id, node list expression) of the allocation this process runs in."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise SlurmError(
            "backend slurm runs inside an allocation: start trainguard from an sbatch script "
            "or an salloc shell (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set)"
        )
    return job, nodelist


async def run_slurm(argv: Sequence[str], timeout_s: float = 30.0) -> str:
    """A Slurm client command's stdout; SlurmError with its stderr when it fails."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not on PATH: is Slurm's client installed?") from None
    except OSError as exc:  # this machine's own (EMFILE, EAGAIN): the command never ran
        raise SlurmError(f"{argv[0]} could not be started here: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SlurmError(f"{shlex.join(argv)} did not answer in {timeout_s:g} s") from None
    if proc.returncode:
        why = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
        raise SlurmError(f"{shlex.join(argv)}: {why}")
    return out.decode(errors="replace")


async def allocation(env: Mapping[str, str] | None = None) -> Allocation:
    job, nodelist = allocation_from_env(env)
    names = (await run_slurm(["scontrol", "show", "hostnames", nodelist])).split()
    if not names:
        raise SlurmError(f"the allocation's node list {nodelist!r} names no node")
    return Allocation(job, tuple(names))


async def nodes(names: Sequence[str]) -> dict[str, Node]:
    """What Slurm says of each node now."""
    text = await run_slurm(["scontrol", "-o", "show", "node", ",".join(names)])
    found = (parse_node(line) for line in text.splitlines())
    return {n.name: n for n in found if n is not None and n.name in names}


class Answer(StrEnum):
    ALIVE = "alive"  # its slurmd accepted a connection
    LOST = "lost"  # refused, unreachable, or no answer in time
    UNKNOWN = "unknown"  # the probe could not run here (this machine is out of descriptors)


@dataclass(frozen=True)
class Probe:
    answer: Answer
    why: str = ""  # for LOST and UNKNOWN: what happened


def read_probe(error: OSError | None) -> Probe:
    """What a connect to a node's slurmd says of the node. An error of this machine's own
    resources (EMFILE, ENFILE, EAGAIN...) says nothing of the node: the probe could not run,
    which is never read as "lost" (a master out of descriptors would lose every node)."""
    if error is None:
        return Probe(Answer.ALIVE)
    if isinstance(error, TimeoutError):
        return Probe(Answer.LOST, "no answer in time")
    code = error.errno
    if code is not None and is_own_resource_errno(code):
        return Probe(Answer.UNKNOWN, f"the probe could not run here: {own_resource_text(code)}")
    return Probe(Answer.LOST, error.strerror or str(error))


async def probe(node: Node, timeout_s: float) -> Probe:
    """Whether the node's slurmd accepts a connection: a machine that died or was cut
    off does not, long before Slurm marks it down."""
    return read_probe(await connect_error(node.addr, node.port, timeout_s))


_ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PENDING",  # requeued: the allocation this master runs in is over
        "PREEMPTED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)


def ended_state(show_job: str) -> str | None:
    """The JobState of `scontrol -o show job` where it says the allocation is over
    (CANCELLED, TIMEOUT...), else None (running, or nothing to read)."""
    for word in show_job.split():
        key, _, value = word.partition("=")
        if key == "JobState":
            return value if value.upper() in _ENDED_STATES else None
    return None


async def allocation_end(job_id: str) -> str | None:
    """How Slurm ended the allocation (its JobState, or "gone" once it forgot the job), or
    None while it runs or where Slurm cannot say (slurmctld unreachable)."""
    try:
        text = await run_slurm(["scontrol", "-o", "show", "job", job_id])
    except SlurmError as exc:
        return "gone" if "Invalid job id" in str(exc) else None
    return ended_state(text)


class AllocationEnd:
    """Whether Slurm ended the allocation (scancel, its time limit), asked when a replica
    fails. One `scontrol show job` answers every failure that asks while it runs, and
    `on_ended` is told once, with why: under salloc no signal tells the master."""

    def __init__(self, on_ended: Callable[[str], None]) -> None:
        self._on_ended = on_ended
        self.state: str | None = None  # how it ended, once seen
        self._query: asyncio.Future[str | None] | None = None

    async def ended(self, job_id: str) -> bool:
        if self.state is None:
            if self._query is None:
                self._query = asyncio.ensure_future(allocation_end(job_id))
            query = self._query
            state = await query
            if self._query is query:
                self._query = None
            if state is not None and self.state is None:
                self.state = state
                why = "scancel, a time limit or a preemption"
                self._on_ended(f"cancelled (Slurm ended allocation {job_id}: {state}; {why})")
        return self.state is not None


async def drain(node: str, reason: str) -> str | None:
    """Drain a node (no new work for it); None, or why it could not be done."""
    try:
        await run_slurm(
            ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
        )
    except SlurmError as exc:
        return str(exc)
    return None
