"""The interface every backend implements, the seam between the master and processes or
machines: start replicas, stop them, and report what happens to them as events. (The one
`api` module is the server's HTTP API, `service.api`.)

The master never touches a process directly; everything it learns arrives as a
`BackendEvent` through the `emit` callback it binds, in the order it happened.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.classify.readings import MachineReading
from trainguard.hangs.stack_model import ReplicaStacks

SERVICE_ENV = "TRAINGUARD_SERVICE"
"""Set (to its role) in the launch of a framework's own process (torchft's Lighthouse):
the backend starts it as it is, never from a warm start planned for the replicas."""


class NoCapacity(Exception):
    """The backend cannot place the attempt's replicas now (too few free resources)."""


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one run of one replica."""

    attempt: int
    replica: str
    rank: int
    restart: int  # how many times this replica was restarted alone in this attempt
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    log_path: Path
    memory_bytes: int | None = None  # its pool's resources.memory (the local backend holds it)


@dataclass(frozen=True)
class ReplicaStarted:
    attempt: int
    replica: str
    restart: int
    pid: int
    time_s: float
    node: str | None = None  # where it runs, when that is not this machine


@dataclass(frozen=True)
class ReplicaFirstOutput:
    attempt: int
    replica: str
    restart: int
    time_s: float


@dataclass(frozen=True)
class ReplicaOutput:
    """Lines a replica printed (each carriage-return update of a bar apart), in order."""

    attempt: int
    replica: str
    restart: int
    segments: tuple[str, ...]
    time_s: float


@dataclass(frozen=True)
class ReplicaExited:
    attempt: int
    replica: str
    restart: int
    pid: int | None
    evidence: ExitEvidence
    time_s: float  # when the backend saw the exit

    @classmethod
    def of(
        cls,
        launch: Launch,
        pid: int | None,
        time_s: float,
        returncode: int | None,
        *,
        stop_requested: bool,
        log_tail: tuple[str, ...],
        oom_kills: int = 0,
        node_lost: str | None = None,
        machine: tuple[MachineReading, ...] = (),
        zygote_died: str | None = None,
    ) -> ReplicaExited:
        """The exit of `launch`'s replica as every backend reports it."""
        ev = ExitEvidence(
            launch.replica,
            returncode,
            stop_requested=stop_requested,
            log_tail=log_tail,
            oom_kills=oom_kills,
            node_lost=node_lost,
            machine=machine,
            zygote_died=zygote_died,
        )
        return cls(launch.attempt, launch.replica, launch.restart, pid, ev, time_s)


BackendEvent = ReplicaStarted | ReplicaFirstOutput | ReplicaOutput | ReplicaExited


def output_events(
    launch: Launch, first: bool, segments: tuple[str, ...], time_s: float
) -> list[BackendEvent]:
    """What a chunk of a run's output tells the master: its first output, its lines."""
    la = launch
    out: list[BackendEvent] = []
    if first:
        out.append(ReplicaFirstOutput(la.attempt, la.replica, la.restart, time_s))
    if segments:
        out.append(ReplicaOutput(la.attempt, la.replica, la.restart, segments, time_s))
    return out


class Backend(Protocol):
    @property
    def warm_start_notes(self) -> Sequence[str]:
        """What the warm start did, or why it is off or a replica starts cold, in order
        (append-only: the master records each new one); empty where there is none."""

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        """Where to send events; called once before anything starts."""

    async def channel_host(self) -> str:
        """The address the master's SDK channel listens on: one every replica can reach
        (this machine's loopback for local replicas; the master's address in the cluster
        for a remote backend), never all interfaces. Called once, before the first attempt."""

    async def rendezvous(self) -> tuple[str, int]:
        """A fresh (MASTER_ADDR, MASTER_PORT) for a new attempt."""

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        """An address (host:port, free now) where each replica runs, for presets whose
        replicas listen where the others must know (TensorFlow's cluster, torchft's
        services). `kept`: the job's addresses so far; each stays while its replica still
        runs where it did, so a replica restarted alone finds its peers again. Called after
        `rendezvous`, once per attempt."""

    async def start(self, launches: Sequence[Launch]) -> None:
        """Start every launch in parallel; each ends in a ReplicaStarted or ReplicaExited."""

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        """Stop these replicas (TERM, grace, KILL) and return once all are gone.

        Their exits are still emitted, marked as requested by the master.
        """

    async def signal(self, replica: str, signum: int) -> bool:
        """Send `signum` to the current run of `replica` where it runs (fault injection:
        SIGKILL, SIGSEGV, SIGSTOP...); False if it is not running."""

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        """When any replica (of `replicas`, default all) last printed anything (0 if none
        has yet): a sign of life."""

    def log_tail(self, replica: str) -> tuple[str, ...]:
        """The last lines the current run of `replica` printed."""

    async def dump_stacks(
        self,
        targets: Sequence[tuple[str, int, int]],
        timeout_s: float,
        faulthandler_files: Mapping[str, Path],
    ) -> list[ReplicaStacks]:
        """Every (replica, rank, pid)'s stacks, taken where it runs, within `timeout_s`."""

    def isolate_after(self, replica: str, c: Classification) -> str | None:
        """Keep what `replica`'s failure points at (a lost node) out of later attempts;
        returns what was isolated and why, for the restart record."""

    async def close(self) -> None:
        """Stop everything still running and release resources."""


@dataclass(frozen=True)
class NodeCheckOutcome:
    """What a node check before a retry found and did, for the restart record; `ran`:
    False where it could not run (not supported, an error): recorded, never fatal."""

    note: str
    excluded: tuple[str, ...] = ()
    ran: bool = True
    changed: bool = False  # a node was left out, or a bad one kept: the record says so
    supported: bool = True  # False: the backend has no node check (one machine, MPI)
    passed: tuple[str, ...] = ()  # nodes checked and found good (as the node ledger names them)


@runtime_checkable
class NodeChecker(Protocol):
    async def check_nodes(self, reason: str) -> NodeCheckOutcome:
        """Check every node the next attempt may use (compute and all-reduce) and keep
        out the bad ones where a spare is left."""


async def check_nodes(backend: object, reason: str) -> NodeCheckOutcome:
    """The backend's node check, where it has one (the optional method `check_nodes`)."""
    if not isinstance(backend, NodeChecker):
        name = type(backend).__name__
        return NodeCheckOutcome(
            f"node check after {reason}: not supported by {name}: the job restarts unchecked",
            ran=False,
            supported=False,
        )
    return await backend.check_nodes(reason)
