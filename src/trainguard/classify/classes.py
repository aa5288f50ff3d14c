"""What a failure is, as values: the kind of exit, the failure class, the evidence of one
exit, and its classification. `trainguard.classify.exits` makes them."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum

from trainguard.classify.logcontext import Phase
from trainguard.classify.readings import MachineReading


class ExitKind(StrEnum):
    HANG = "hang"  # no exit at all: the hang or exit-hang detector fired
    CLEAN = "clean"  # exit 0
    STOP_REQUESTED = "stop_requested"  # the master stopped it: never charged
    SIGNAL = "signal"
    NONZERO = "nonzero"
    SPAWN_ERROR = "spawn_error"  # the command could not be started at all
    NODE_LOST = "node_lost"  # the machine under it went away: no exit status at all


class FailureClass(StrEnum):
    USER_ERROR = "user_error"
    TRANSIENT_EXIT = "transient_exit"
    HOST_OOM = "host_oom"
    DEVICE_OOM = "device_oom"
    RETRYABLE_MESSAGE = "retryable_message"
    CAPACITY = "insufficient_capacity"
    PREEMPTION = "preemption"
    HANG = "hang"
    EXIT_HANG = "exit_hang"
    INTERNAL = "internal"
    NODE_LOST = "node_lost"


TRANSIENT_SIGNALS: frozenset[int] = frozenset({signal.SIGABRT, signal.SIGSEGV})
"""Deaths retried as transient by default, as Vertex and AI Platform do."""

EXTERNAL_KILL_SIGNALS: frozenset[int] = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT})
"""A kill the master did not send: preemption-like, so retryable."""

INTERNAL_ERROR_MESSAGE = "Internal error occurred for the current attempt."

UNCERTAIN_BELOW = 0.6
"""A classification less confident than this is `uncertain` (R-CLS-2)."""


@dataclass(frozen=True)
class ExitEvidence:
    """What is known about one replica's end, gathered by the backend."""

    replica: str
    returncode: int | None  # None when the command never started
    stop_requested: bool = False
    spawn_error: str | None = None
    spawn_errno: int | None = None  # the OSError's errno when the start failed (EMFILE...)
    log_tail: tuple[str, ...] = ()
    oom_kills: int = 0  # new kernel OOM kills seen in our cgroup while it ran
    node_lost: str | None = None  # the node under it died: what the backend was told
    progressed: bool | None = None  # it showed training progress (None: the log must tell)
    peers_finished: bool = False  # every other replica of its attempt had exited 0 before it
    own_ports: tuple[int, ...] = ()  # the ports trainguard chose for its attempt (rendezvous)
    # how the warm-start process that forked it died ("killed by SIGKILL"), which took the
    # replica along: the backend knows it; no line the replica prints can say it
    zygote_died: str | None = None
    # What the machine said at the failure (classify.readings), absent sources included;
    # empty where nothing was gathered (a pasted log, the corpus): then only the log counts.
    machine: tuple[MachineReading, ...] = ()


@dataclass(frozen=True)
class Classification:
    kind: ExitKind
    failure_class: FailureClass | None  # None for clean and requested exits
    retryable: bool
    rule: str  # the rule that decided, for `explain`
    exit_code: int | None  # as a shell shows it (139, not -11)
    signal: str | None
    reason: str  # the termination reason of the message
    message: str  # the job's error message if this exit ends it
    matched_line: str | None = None
    fingerprint: str | None = None
    cascade: bool = False  # an error that usually follows another replica's death
    hardware: bool = False  # points at a faulty device or node
    confidence: float = 1.0  # how sure the evidence makes the class (see UNCERTAIN_BELOW)
    phase: str = Phase.UNKNOWN.value  # start-up or training, when the failure happened
    notes: tuple[str, ...] = ()  # what the context changed, for `explain`
    readings: tuple[MachineReading, ...] = ()  # the machine's, as weighed (classify.machine)

    @property
    def is_failure(self) -> bool:
        return self.failure_class is not None

    @property
    def uncertain(self) -> bool:
        """Too little evidence to be sure: a retryable one is retried at most once."""
        return self.failure_class is not None and self.confidence < UNCERTAIN_BELOW


def exit_message(replica: str, code: int, cls: FailureClass, reason: str) -> str:
    reason = reason.rstrip(".")  # the sentence's own full stop ends it
    if cls is FailureClass.HOST_OOM:
        return (
            f"The replica {replica} ran out of memory and exited with a non-zero status of {code}."
        )
    if cls is FailureClass.DEVICE_OOM:
        return (
            f"The replica {replica} ran out of GPU memory and exited with a non-zero status "
            f"of {code}. Termination reason: {reason}."
        )
    return (
        f"The replica {replica} exited with a non-zero status of {code}. "
        f"Termination reason: {reason}."
    )


def short_line(line: str, limit: int = 240) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."
