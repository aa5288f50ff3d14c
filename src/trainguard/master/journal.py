"""Transitions recorded in one place (issue 39): the master says what moved as a value,
and the journal turns it into the recorder's rows (and the line the user sees). Only here
are `Recorder.transition`, `attempt_started` and `attempt_ended` called."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from trainguard.records.recorder import Recorder
from trainguard.states import JobState


@dataclass(frozen=True)
class JobMoved:
    """The job's phase moved; `values` are the job row's fields that move with it
    (error code and message, why it waits)."""

    prev: JobState
    next: JobState
    at_s: float
    reason: str
    values: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class AttemptStarted:
    number: int
    at_s: float
    addr: str
    port: int


@dataclass(frozen=True)
class AttemptEnded:
    """An attempt ended: `outcome` is an `AttemptOutcome`, or the job's final state."""

    number: int
    at_s: float
    outcome: str
    reason: str


Entry = JobMoved | AttemptStarted | AttemptEnded


class Journal:
    """Writes each transition the master makes through the job's recorder."""

    def __init__(self, rec: Recorder, job_id: str, say: Callable[[str], None]) -> None:
        self.rec = rec
        self.job_id = job_id
        self.say = say

    def record(self, entry: Entry) -> None:
        match entry:
            case JobMoved():
                values = dict(entry.values)
                self.rec.transition(entry.prev, entry.next, entry.at_s, entry.reason, **values)
                self.say(f"job {self.job_id} {entry.next.value}: {entry.reason}")
            case AttemptStarted():
                self.rec.attempt_started(entry.number, entry.at_s, entry.addr, entry.port)
            case AttemptEnded():
                self.rec.attempt_ended(entry.number, entry.at_s, entry.outcome, entry.reason)
