"""The fakes every logic test shares: a backend that starts nothing and a clock that moves
only when told. The real backends are tested against real processes elsewhere; these
drive the master's and the policy's logic step by step.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from trainguard.backends.api import (
    SERVICE_ENV,
    BackendEvent,
    Launch,
    NoCapacity,
    ReplicaExited,
    ReplicaOutput,
    ReplicaStarted,
)
from trainguard.backends.net import free_port
from trainguard.classify.classes import ExitEvidence
from trainguard.hangs.snapshot import snapshot_all
from trainguard.master.loop import Master
from trainguard.records.recorder import Recorder
from trainguard.records.rows import JobRow, _Row
from trainguard.records.store import Store
from trainguard.spec.models import validate_spec


class FakeClock:
    """Seconds that pass only when a test says so (`advance`)."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class FakeBackend:
    """Starts nothing; reports what a test tells it, in the order it is told."""

    warm_start_notes: Sequence[str] = ()

    def __init__(self, fail_start: bool = False) -> None:
        self.emit: Callable[[BackendEvent], None] = lambda _e: None
        self.launches: list[Launch] = []
        self.live: dict[str, Launch] = {}
        self.stops: list[list[str]] = []
        self.port = 40000
        self.fail_start = fail_start
        self.no_capacity: str | None = None  # rendezvous raises NoCapacity with this
        self.signals: list[tuple[str, int]] = []  # what fault injection sent, in order
        self.closed = False
        self.exit_on_stop: dict[str, int] = {}  # a replica ending on its own as the stop came
        self.nodes: dict[str, str] = {}  # replica -> the node label its start reports
        self.listening: dict[str, socket.socket] = {}  # services' listening sockets

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        self.emit = emit

    async def channel_host(self) -> str:
        return "127.0.0.1"  # every replica runs on this machine

    async def rendezvous(self) -> tuple[str, int]:
        if self.no_capacity is not None:
            raise NoCapacity(self.no_capacity)
        self.port += 1
        return "127.0.0.1", self.port

    async def task_addresses(
        self, replicas: Sequence[str], kept: Mapping[str, str]
    ) -> dict[str, str]:
        return {r: kept.get(r) or f"127.0.0.1:{free_port()}" for r in replicas}

    async def start(self, launches: Sequence[Launch]) -> None:
        if self.fail_start:
            raise RuntimeError("backend exploded")
        for launch in launches:
            if SERVICE_ENV in launch.env:
                self._listen(launch)
            self.launches.append(launch)
            self.live[launch.replica] = launch
            pid = 1000 + len(self.launches)
            node = self.nodes.get(launch.replica)
            self.emit(
                ReplicaStarted(launch.attempt, launch.replica, launch.restart, pid, 1.0, node=node)
            )

    def exit(
        self,
        replica: str,
        returncode: int,
        stop_requested: bool = False,
        progressed: bool = True,
        log_tail: tuple[str, ...] = (),
    ) -> None:
        """`progressed`: the replica had trained (a crash mid-run, not in start-up)."""
        launch = self.live.pop(replica)
        if (sock := self.listening.pop(replica, None)) is not None:
            sock.close()
        ev = ExitEvidence(
            replica,
            returncode,
            stop_requested=stop_requested,
            log_tail=log_tail,
            progressed=progressed,
        )
        self.emit(ReplicaExited(launch.attempt, replica, launch.restart, 1, ev, 2.0))

    def print(self, replica: str, *lines: str, time_s: float = 1.5) -> None:
        """The current run of `replica` printed these lines."""
        launch = self.live[replica]
        self.emit(ReplicaOutput(launch.attempt, replica, launch.restart, lines, time_s))

    def _listen(self, launch: Launch) -> None:
        """A service (torchft's Lighthouse, a store) listens where its command says."""
        argv = launch.argv
        where = argv[argv.index("--bind") + 1] if "--bind" in argv else argv[-1]
        host, _, port = where.rpartition(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen()
        old = self.listening.pop(launch.replica, None)
        if old is not None:
            old.close()
        self.listening[launch.replica] = sock

    async def signal(self, replica: str, signum: int) -> bool:
        self.signals.append((replica, signum))
        return replica in self.live

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        self.stops.append(list(replicas))
        for name in replicas:
            if name in self.live:
                self.exit(name, self.exit_on_stop.get(name, -15), stop_requested=True)

    def log_tail(self, replica: str) -> tuple[str, ...]:
        return ()

    async def snapshot(self, targets: Any, timeout_s: float, files: Any) -> list[Any]:
        return await snapshot_all(targets, timeout_s=timeout_s, faulthandler_files=files)

    def isolate_after(self, replica: str, c: Any) -> None:
        return None

    def last_output_s(self, replicas: Collection[str] | None = None) -> float:
        return 0.0

    async def close(self) -> None:
        self.closed = True
        await self.stop(list(self.live), 0)
        for sock in self.listening.values():
            sock.close()


R = TypeVar("R", bound=_Row)


def row(kind: type[R], **values: Any) -> R:
    """A store row of `kind` with None for every column a test does not name."""
    return kind(**({f.name: None for f in fields(kind)} | values))


def job_row(**values: Any) -> JobRow:
    """A jobs row with defaults for what a test does not care about."""
    base: dict[str, Any] = {"id": "job-1", "name": "t", "spec_json": "{}", "state": "RUNNING"}
    base |= {"created_at_s": 0.0, "attempts": 0, "log_dir": "/tmp"}
    return row(JobRow, **(base | values))


def make_master(
    tmp_path: Path, backend: FakeBackend, clock: Callable[[], float] | None = None, **spec: Any
) -> tuple[Master, Store]:
    """A job master on `backend` with a real store under `tmp_path`: 2 workers by default."""
    data: dict[str, Any] = {
        "name": "t",
        "worker_pools": [{"role": "worker", "replicas": 2, "command": ["x"]}],
        **spec,
    }
    job = validate_spec(data)
    store = Store(tmp_path / "home")
    rec = Recorder(store, "job-1")
    rec.job_created(name="t", spec=job, log_dir=tmp_path / "logs", at_s=0.0, master={})
    m = Master(
        job_id="job-1",
        spec=job,
        backend=backend,
        recorder=rec,
        log_dir=tmp_path / "logs",
        cwd=str(tmp_path),
        clock=clock or time.time,
    )
    return m, store
