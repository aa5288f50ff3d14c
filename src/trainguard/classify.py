"""Exit classification (R-CLS-1, R-CLS-2 for exit codes): pure, no processes, no clock.

Every replica exit becomes a `Classification`: what kind of exit it was, which failure
class it belongs to, whether it is worth a retry, and which rule said so.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from enum import StrEnum

from trainguard.signals import decode_returncode, signal_name


class ExitKind(StrEnum):
    CLEAN = "clean"  # exit 0
    STOP_REQUESTED = "stop_requested"  # the master stopped it: never charged
    SIGNAL = "signal"
    NONZERO = "nonzero"
    SPAWN_ERROR = "spawn_error"  # the command could not be started at all


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


TRANSIENT_SIGNALS: frozenset[int] = frozenset({signal.SIGABRT, signal.SIGSEGV})
"""Deaths retried as transient by default, as Vertex and AI Platform do."""

EXTERNAL_KILL_SIGNALS: frozenset[int] = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT})
"""A kill the master did not send: preemption-like, so retryable."""


@dataclass(frozen=True)
class ExitEvidence:
    """What is known about one replica's end, gathered by the backend."""

    replica: str
    returncode: int | None  # None when the command never started
    stop_requested: bool = False
    spawn_error: str | None = None
    log_tail: tuple[str, ...] = ()
    oom_kills: int = 0  # new kernel OOM kills seen in our cgroup while it ran


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

    @property
    def is_failure(self) -> bool:
        return self.failure_class is not None


_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w]*\.)*(Exception|[A-Z]\w*(Error|Exception|Interrupt|Exit|Group))(:.*)?$"
)


def last_exception(lines: tuple[str, ...]) -> str | None:
    """The `KeyError: 'x'` line closing the last Python traceback in a log tail."""
    seen_traceback = False
    found: str | None = None
    for raw in lines:
        # exception groups (3.11+) draw their sub-tracebacks behind `| ` and `+-` rails
        line = raw.strip().lstrip("|+ ").strip()
        if "Traceback (most recent call last)" in line:
            seen_traceback = True
            found = None
        elif seen_traceback and _EXC_LINE.match(line):
            found = line
    return found


def _nonzero_message(replica: str, code: int, reason: str) -> str:
    return (
        f"The replica {replica} exited with a non-zero status of {code}. "
        f"Termination reason: {reason}."
    )


def classify_exit(ev: ExitEvidence) -> Classification:
    """Classify one exit from its evidence alone."""
    if ev.returncode is None:
        why = ev.spawn_error or "the command could not be started"
        return Classification(
            ExitKind.SPAWN_ERROR,
            FailureClass.USER_ERROR,
            False,
            "spawn-error",
            None,
            None,
            why,
            f"The replica {ev.replica} could not be started: {why}.",
        )
    code, sig = decode_returncode(ev.returncode)
    sig_name = signal_name(sig) if sig is not None else None
    if ev.stop_requested:
        return Classification(
            ExitKind.STOP_REQUESTED, None, False, "stop-requested", code, sig_name, "stopped", ""
        )
    if ev.returncode == 0:
        return Classification(ExitKind.CLEAN, None, False, "clean-exit", 0, None, "", "")

    kind = ExitKind.SIGNAL if sig is not None else ExitKind.NONZERO
    if sig == signal.SIGKILL and ev.oom_kills > 0:
        return Classification(
            kind,
            FailureClass.HOST_OOM,
            True,
            "host-oom-cgroup",
            code,
            sig_name,
            "OOMKilled",
            f"The replica {ev.replica} ran out of memory and exited with a non-zero status "
            f"of {code}.",
        )
    if sig is not None and sig in TRANSIENT_SIGNALS:
        return Classification(
            kind,
            FailureClass.TRANSIENT_EXIT,
            True,
            f"transient-signal-{sig_name}",
            code,
            sig_name,
            str(sig_name),
            _nonzero_message(ev.replica, code, str(sig_name)),
        )
    if sig is not None and sig in EXTERNAL_KILL_SIGNALS:
        return Classification(
            kind,
            FailureClass.PREEMPTION,
            True,
            f"external-{sig_name}",
            code,
            sig_name,
            f"{sig_name} (killed from outside trainguard)",
            _nonzero_message(ev.replica, code, f"{sig_name} (killed from outside trainguard)"),
        )
    exc = last_exception(ev.log_tail)
    reason = exc if exc else (str(sig_name) if sig_name else "Error")
    rule = "python-traceback" if exc else ("other-signal" if sig_name else "nonzero-exit")
    return Classification(
        kind,
        FailureClass.USER_ERROR,
        False,
        rule,
        code,
        sig_name,
        reason,
        _nonzero_message(ev.replica, code, reason),
        matched_line=exc,
    )


INTERNAL_ERROR_MESSAGE = "Internal error occurred for the current attempt."
