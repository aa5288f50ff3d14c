"""The fakes every logic test shares: a backend that starts nothing and a clock that moves
only when told. The real backends are tested against real processes elsewhere; these
drive the master's and the policy's logic step by step.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from trainguard.backends.interface import (
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
from trainguard.hangs.stack_model import Frame, ReplicaStacks, ThreadStack
from trainguard.master.events import Transition
from trainguard.master.loop import Master
from trainguard.records.recorder import Recorder
from trainguard.records.rows import JobRow, _Row
from trainguard.records.store import Store
from trainguard.spec.models import validate_spec


class FakeTimer:
    """One call `FakeClock.later` scheduled."""

    def __init__(self, due_s: float, order: int, fn: Callable[[], None]) -> None:
        self.due_s, self.order, self.fn = due_s, order, fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """Seconds that pass only when a test says so (`advance`), and the timers they fire: the
    job's clock and its `trainguard.timers.Timers` in one."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now
        self._timers: list[FakeTimer] = []
        self._made = 0  # timers scheduled so far: equal due times fire in this order

    def __call__(self) -> float:
        return self.now

    def later(self, delay_s: float, fn: Callable[[], None]) -> FakeTimer:
        """`fn` runs when `advance` reaches now + delay_s (never inside this call)."""
        self._made += 1
        timer = FakeTimer(self.now + max(0.0, delay_s), self._made, fn)
        self._timers.append(timer)
        return timer

    def pending(self) -> list[float]:
        """When each timer not yet fired nor cancelled is due, soonest first."""
        return sorted(t.due_s for t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> float:
        """Move the clock `seconds` on, firing every timer due by then in time order, each
        with the clock at its due time; one that a fired timer schedules fires too if due."""
        return self.advance_to(self.now + seconds)

    def advance_to(self, end: float) -> float:
        """`advance` to the time `end` (no earlier than now)."""
        assert end >= self.now, f"time runs forward only: {end} < {self.now}"
        while True:
            due = [t for t in self._timers if not t.cancelled and t.due_s <= end]
            if not due:
                break
            first = min(due, key=lambda t: (t.due_s, t.order))
            self._timers.remove(first)
            self.now = max(self.now, first.due_s)
            first.fn()
        self._timers = [t for t in self._timers if not t.cancelled]
        self.now = end
        return self.now


_WAITING = (
    ThreadStack(1, "MainThread", True, (Frame("wait", "train.py", 10, False),)),
)  # the stack a fake replica shows unless a test cans another


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
        self.stacks: dict[str, tuple[ThreadStack, ...]] = {}  # what a stack dump finds (canned)
        self.dumps: list[list[str]] = []  # the replicas each stack dump was asked for

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

    async def dump_stacks(
        self, targets: Sequence[tuple[str, int, int]], timeout_s: float, files: Any
    ) -> list[ReplicaStacks]:
        """Canned stacks: `stacks[replica]`, else one main thread waiting in `train.py`.
        The pids are made up: nothing is ever attached to (no py-spy, no signal)."""
        self.dumps.append([name for name, _, _ in targets])
        return [
            ReplicaStacks(
                name, rank, pid, "canned", True, None, 0.0, self.stacks.get(name, _WAITING)
            )
            for name, rank, pid in targets
        ]

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
    tmp_path: Path, backend: FakeBackend, clock: FakeClock | None = None, **spec: Any
) -> tuple[Master, Store]:
    """A job master on `backend` with a real store under `tmp_path`: 2 workers by default.
    Its time is `clock` (a fresh `FakeClock` if none): nothing fires until a test advances it."""
    data: dict[str, Any] = {
        "name": "t",
        "worker_pools": [{"role": "worker", "replicas": 2, "command": ["x"]}],
        **spec,
    }
    job = validate_spec(data)
    clock = clock or FakeClock()
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
        clock=clock,
        timers=clock,
    )
    return m, store


async def settle(master: Master) -> list[Transition]:
    """Everything the master has to do now, as its loop would: each queued event through
    `step`, and its background tasks (a signal sent, a replica started alone) run out.
    Returns what each turn did."""
    turns = []
    while True:
        while not master._queue.empty():
            turns.append(await master.step(master._queue.get_nowait()))
        if master._background:
            await asyncio.gather(*list(master._background))
            continue
        await asyncio.sleep(0)  # what the turns handed to the event loop
        if master._queue.empty() and not master._background:
            return turns


async def pass_time(master: Master, clock: FakeClock, seconds: float) -> list[Transition]:
    """`seconds` of the job's time in zero real time: every timer due meanwhile fires at its
    time, and what it set off is settled before the next one fires."""
    end = clock.now + seconds
    turns = await settle(master)
    while (due := clock.pending()) and due[0] <= end:
        clock.advance_to(max(due[0], clock.now))
        turns += await settle(master)
    clock.advance_to(end)
    return turns + await settle(master)
