"""What the master's handlers may do (issue 39): start, stop, settle and signal replicas,
move the job and its replicas (checked by `moves`, recorded by the journal), note an
event, and post an event now or later. The handlers act only through `Actions`;
`MasterActions` carries it out with the backend, the timers, the journal and the loop's
queue of events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

from trainguard.backends.interface import Backend, Launch, ReplicaExited
from trainguard.master import moves
from trainguard.master.events import MasterEvent, Outcome, ReplicaSlot
from trainguard.master.journal import AttemptEnded, AttemptStarted, JobMoved, Journal
from trainguard.master.state import MasterState
from trainguard.records.recorder import Recorder
from trainguard.records.schema import WARM_START_EVENT
from trainguard.states import JobState, ReplicaState
from trainguard.timers import Timer, Timers


class Actions(Protocol):
    def now(self) -> float: ...

    def say(self, text: str) -> None: ...

    def note(self, replica: str | None, kind: str, text: str, at_s: float | None = None) -> None:
        """Record an event of the job (now, unless `at_s`)."""
        ...

    async def start(self, launches: Sequence[Launch], warm_notes: bool = True) -> None:
        """Start these runs; then record what the warm start did (unless not `warm_notes`)."""
        ...

    async def stop(self, replicas: Collection[str], grace_s: float | None = None) -> None:
        """TERM, `grace_s` (None: the spec's grace period), KILL."""
        ...

    async def settle(self, only: Collection[str] | None = None) -> None:
        """Record the exits a stop produced before the job moves on; they decide nothing.
        `only`: the stop was of these replicas; the others' exits are left to decide."""
        ...

    async def stop_all(self) -> None:
        """Stop every live replica, then settle."""
        ...

    def signal(self, replica: str, sig: int) -> None:
        """Send `sig` to a replica (in the background: the loop goes on)."""
        ...

    def transition(self, phase: JobState, reason: str, **values: object) -> None: ...

    def tear_down(self, reason: str, **values: object) -> None:
        """RESTARTING: the current attempt's exits from now on are consequences."""
        ...

    def move(self, rep: ReplicaSlot, state: ReplicaState) -> None:
        """One run of a replica moves to `state`."""
        ...

    def record(self, entry: AttemptStarted | AttemptEnded) -> None:
        """An attempt started or ended (the job's outcome counts the attempts)."""
        ...

    def schedule(self, delay_s: float, event: MasterEvent) -> Timer:
        """Post `event` in `delay_s`."""
        ...

    def later(self, delay_s: float, fn: Callable[[], None]) -> Timer: ...

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run `work` beside the loop (`settle` in the tests waits for it)."""
        ...

    def post(self, event: MasterEvent) -> None: ...

    def take_queued(self) -> list[MasterEvent]:
        """Every event queued now, in order (put them back with `post`)."""
        ...


class MasterActions:
    """`Actions` over the job's backend, timers, journal and event queue. `settled` records
    an exit a stop caused (the exits handler's; set once it exists)."""

    def __init__(
        self,
        job: MasterState,
        outcome: Outcome,
        backend: Backend,
        rec: Recorder,
        journal: Journal,
        queue: asyncio.Queue[MasterEvent],
        background: set[asyncio.Future[Any]],
        *,
        clock: Callable[[], float],
        timers: Timers,
        say: Callable[[str], None],
        grace_s: float,
        strict: bool,
    ) -> None:
        self.job = job
        self.outcome = outcome
        self.backend = backend
        self.rec = rec
        self.journal = journal
        self.queue = queue
        self.background = background
        self.clock = clock
        self.timers = timers
        self._say = say
        self.grace_s = grace_s
        self.strict = strict
        self.settled: Callable[[ReplicaExited], Awaitable[None]] | None = None

    def now(self) -> float:
        return self.clock()

    def say(self, text: str) -> None:
        self._say(text)

    def note(self, replica: str | None, kind: str, text: str, at_s: float | None = None) -> None:
        self.rec.event(self.clock() if at_s is None else at_s, replica, kind, text)

    async def start(self, launches: Sequence[Launch], warm_notes: bool = True) -> None:
        await self.backend.start(launches)
        if not warm_notes:
            return
        notes = self.backend.warm_start_notes
        for note in notes[self.job.warm_notes_seen :]:
            self.say(note)
            self.note(None, WARM_START_EVENT, note)
        self.job.warm_notes_seen = len(notes)

    async def stop(self, replicas: Collection[str], grace_s: float | None = None) -> None:
        await self.backend.stop(list(replicas), self.grace_s if grace_s is None else grace_s)

    async def settle(self, only: Collection[str] | None = None) -> None:
        keep: list[MasterEvent] = []
        with self.rec.ending():  # a stop's exits, recorded in one transaction
            while not self.queue.empty():
                ev = self.queue.get_nowait()
                if isinstance(ev, ReplicaExited) and (only is None or ev.replica in only):
                    assert self.settled is not None  # wired by the master
                    await self.settled(ev)
                else:
                    keep.append(ev)
        for ev in keep:
            self.queue.put_nowait(ev)

    async def stop_all(self) -> None:
        await self.stop(self.job.live())
        await self.settle()

    def signal(self, replica: str, sig: int) -> None:
        self.spawn(self.backend.signal(replica, sig))  # the seam of injected faults

    def transition(self, phase: JobState, reason: str, **values: object) -> None:
        self._check(self.job.phase, phase, None)
        prev, self.job.phase = self.job.phase, phase
        self.outcome.state = phase
        self.journal.record(JobMoved(prev, phase, self.clock(), reason, values))

    def tear_down(self, reason: str, **values: object) -> None:
        self.job.torn_down = self.job.attempt
        self.transition(JobState.RESTARTING, reason, **values)

    def move(self, rep: ReplicaSlot, state: ReplicaState) -> None:
        self._check(rep.state, state, rep.plan.name)
        rep.state = state

    def _check(
        self, old: JobState | ReplicaState, new: JobState | ReplicaState, replica: str | None
    ) -> None:
        def note(text: str) -> None:
            self.note(replica, moves.INTERNAL_EVENT, text)
            self.say(f"internal error: {text}")

        moves.checked(old, new, self.strict, note)

    def record(self, entry: AttemptStarted | AttemptEnded) -> None:
        self.journal.record(entry)
        if isinstance(entry, AttemptStarted):
            self.outcome.attempts = entry.number + 1

    def schedule(self, delay_s: float, event: MasterEvent) -> Timer:
        return self.timers.later(delay_s, lambda: self.post(event))

    def later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        return self.timers.later(delay_s, fn)

    def spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def post(self, event: MasterEvent) -> None:
        self.queue.put_nowait(event)

    def take_queued(self) -> list[MasterEvent]:
        taken = []
        while not self.queue.empty():
            taken.append(self.queue.get_nowait())
        return taken
