"""Failure classification (R-CLS-1, R-CLS-2): pure, no processes, no clock, no files.

Every replica exit becomes a `Classification`: what kind of exit it was, its failure
class, whether a retry can help, which rule said so on which log line, and a
fingerprint for counting "the same error". The evidence is weighed in this order:

1. the exit itself: a clean exit, a stop the master asked for, a command that never
   started;
2. the job's own retryable keywords, anywhere in the tail;
3. a SIGKILL while the cgroup's OOM-kill counter rose: host OOM;
4. the catalogue (signatures.yaml), first on the exception that closes the last
   traceback, then on the lines from that traceback on (the whole tail if none),
   newest first. A death by signal is not explained by a bug the log mentions;
5. the exit code: SIGSEGV/SIGABRT are transient, SIGKILL/SIGTERM from outside are
   preemption, anything else is a user error (a traceback names it).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace
from enum import StrEnum

from trainguard.fingerprint import fingerprint
from trainguard.logcontext import (
    Phase,
    child_signal,
    collective_mismatch,
    crash_cause,
    first_collectives,
    gpu_held_elsewhere,
    phase_of,
    root_exception_block,
    solo_work_before_timeout,
)
from trainguard.logtail import clean, exception_block
from trainguard.signals import decode_returncode, signal_name
from trainguard.signatures import Rules, Signature, first_match


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
    log_tail: tuple[str, ...] = ()
    oom_kills: int = 0  # new kernel OOM kills seen in our cgroup while it ran
    node_lost: str | None = None  # the node under it died: what the backend was told
    progressed: bool | None = None  # it showed training progress (None: the log must tell)


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

    @property
    def is_failure(self) -> bool:
        return self.failure_class is not None

    @property
    def uncertain(self) -> bool:
        """Too little evidence to be sure: a retryable one is retried at most once."""
        return self.failure_class is not None and self.confidence < UNCERTAIN_BELOW


def _message(replica: str, code: int, cls: FailureClass, reason: str) -> str:
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


def _short(line: str, limit: int = 240) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


_ABORT_AFTER_EXCEPTION = 5
"""Lines a process may print between an uncaught traceback and its abort at exit
(`terminate called without an active exception`, a core-dump notice)."""


def _died_of_it(lines: tuple[str, ...], sig: int | None) -> bool:
    """An uncaught exception, then SIGABRT/SIGSEGV while the interpreter shut down
    (native threads of gloo or NCCL still running): the exception is the cause."""
    if sig not in TRANSIENT_SIGNALS:
        return False
    block = exception_block(lines)
    if block is None:
        return False
    return len(lines) - (block[1] + 1) <= _ABORT_AFTER_EXCEPTION


def find_evidence(lines: tuple[str, ...], rules: Rules) -> tuple[Signature, str] | None:
    """The signature that explains a log tail, and the line it matched (steps 2 and 4).

    Strong signatures first, weak ones (a wrapper's or a bystander's words) only when no
    strong one matches: each in the root exception (inside a launcher's wrapper), then the
    lines from its traceback on, newest first, then the older lines, where only evidence
    of a fault from outside the code counts (an Xid, a hang-up, an OOM kill).
    """
    cleaned = [clean(x) for x in lines]
    for line in reversed(cleaned):
        sig = first_match(rules.user, line)
        if sig is not None:
            return sig, line
    block = root_exception_block(lines)
    start = block[0] if block is not None else 0
    ordered = [(x, True) for x in block[2]] if block is not None else []
    ordered += [(x, True) for x in reversed(cleaned[start:])]
    ordered += [(x, False) for x in reversed(cleaned[:start])]  # older: faults from outside
    cascade: tuple[Signature, str] | None = None
    for weak in (False, True):
        for line, any_class in ordered:
            sig = first_match(rules.catalogue, line, weak)
            if sig is None or not (any_class or sig.failure_class != FailureClass.USER_ERROR):
                continue
            if not sig.cascade:
                return sig, line
            # A peer's reset or the process group's abort follows a cause: look on for it.
            cascade = cascade or (sig, line)
        if cascade is not None:
            return cascade
    return None


def classify_exit(ev: ExitEvidence, rules: Rules | None = None) -> Classification:
    """Classify one exit from its evidence alone."""
    # A lost node is never the master's doing, even when a stop was on its way to it.
    if ev.node_lost is not None:
        return Classification(
            ExitKind.NODE_LOST,
            FailureClass.NODE_LOST,
            True,
            "node-lost",
            None,
            None,
            ev.node_lost,
            f"The node hosting replica {ev.replica} was lost: {ev.node_lost}.",
            fingerprint=fingerprint(f"node-lost:{ev.replica}"),
            hardware=False,  # the node, not a device: the backend excludes it
        )
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
            fingerprint=fingerprint(f"spawn:{why}"),
        )
    code, sig = decode_returncode(ev.returncode)
    sig_name = signal_name(sig) if sig is not None else None
    if ev.returncode == 0:  # even when asked to stop: it finished its work first
        return Classification(ExitKind.CLEAN, None, False, "clean-exit", 0, None, "", "")
    if ev.stop_requested:
        return Classification(
            ExitKind.STOP_REQUESTED, None, False, "stop-requested", code, sig_name, "stopped", ""
        )

    kind = ExitKind.SIGNAL if sig is not None else ExitKind.NONZERO
    rules = rules or Rules.default()
    phase = phase_of(ev.log_tail, ev.progressed)
    v = weigh(ev, sig, rules, phase)
    return Classification(
        kind,
        v.cls,
        v.retryable,
        v.rule,
        code,
        sig_name,
        v.reason,
        _message(ev.replica, code, v.cls, v.reason),
        matched_line=v.line,
        fingerprint=fingerprint(f"{v.cls}:{v.line or v.reason}"),
        cascade=bool(v.matched and v.matched.cascade),
        hardware=bool(v.matched and v.matched.hardware),
        confidence=v.confidence,
        phase=phase.value,
        notes=v.notes,
    )


@dataclass(frozen=True)
class Verdict:
    """What the evidence of one failed exit says, before it is dressed as a Classification."""

    cls: FailureClass
    retryable: bool
    rule: str
    reason: str
    confidence: float
    line: str | None = None
    matched: Signature | None = None
    notes: tuple[str, ...] = ()


def _signal_number(name: str | None) -> int | None:
    try:
        return int(signal.Signals[name]) if name else None
    except KeyError:
        return None


def weigh(ev: ExitEvidence, sig: int | None, rules: Rules, phase: Phase) -> Verdict:
    """The evidence of a failed exit, weighed in the order the module docstring gives."""
    notes: list[str] = []
    lines = ev.log_tail
    if sig is None:  # a launcher that exits 1 may say which signal its child died of
        sig = _signal_number(child_signal(lines))
        if sig is not None:
            notes.append(f"the launcher's summary says the child died of {signal_name(sig)}")
    sig_name = signal_name(sig) if sig is not None else None
    if sig == signal.SIGKILL and ev.oom_kills > 0:
        return Verdict(FailureClass.HOST_OOM, False, "host-oom-cgroup", "OOMKilled", 0.99)
    evidence = find_evidence(lines, rules)
    if evidence is not None:
        matched, line = evidence
        cls = FailureClass(matched.failure_class)
        # A Python bug ends in exit 1, not in a signal: a death by signal is not explained
        # by an exception its log happens to mention (OOM or hardware text still counts),
        # unless an uncaught traceback is the last thing it said before aborting.
        if not (sig is not None and cls is FailureClass.USER_ERROR) or _died_of_it(lines, sig):
            v = Verdict(
                cls,
                matched.retryable,
                matched.id,
                _short(line),
                matched.confidence,
                line,
                matched,
                tuple(notes),
            )
            return _in_context(v, lines, phase)
        notes.append(f"{matched.id} on {_short(line, 80)!r} does not explain a death by signal")
    if sig is not None and sig in TRANSIENT_SIGNALS:
        cause = crash_cause(lines)
        if cause is not None:
            return Verdict(
                FailureClass.USER_ERROR,
                False,
                f"crash-with-cause-{sig_name}",
                _short(cause),
                0.7,
                cause,
                notes=(*notes, f"{sig_name} follows a deterministic cause in the log"),
            )
        trained = phase is Phase.TRAINING
        return Verdict(
            FailureClass.TRANSIENT_EXIT,
            True,
            f"transient-signal-{sig_name}",
            str(sig_name),
            0.6 if trained else 0.5,  # retried as transient by convention (Vertex)
            notes=(
                *notes,
                "a bare crash: nothing in the log says why"
                + ("" if trained else ", and no training step before it: retried once"),
            ),
        )
    if sig == signal.SIGKILL and _shell_killed(lines):
        return Verdict(
            FailureClass.HOST_OOM,
            False,
            "killed-by-the-kernel",
            "SIGKILL with the shell's 'Killed'",
            0.55,
            notes=(*notes, "a SIGKILL the shell reported: most often the kernel's OOM killer"),
        )
    if sig is not None and sig in EXTERNAL_KILL_SIGNALS:
        reason = f"{sig_name} (killed from outside trainguard)"
        return Verdict(
            FailureClass.PREEMPTION, True, f"external-{sig_name}", reason, 0.7, notes=tuple(notes)
        )
    block = root_exception_block(lines)
    if block is not None:
        line = block[2][0]
        return Verdict(
            FailureClass.USER_ERROR,
            False,
            "python-traceback",
            _short(line),
            0.85,
            line,
            notes=tuple(notes),
        )
    if sig_name is not None:
        return Verdict(FailureClass.USER_ERROR, False, "other-signal", sig_name, 0.5)
    return Verdict(FailureClass.USER_ERROR, False, "nonzero-exit", "Error", 0.5)


_COLLECTIVE_RULES = frozenset({"collective-timeout", "nccl-error"})


def _reread(
    v: Verdict, cls: FailureClass, retryable: bool, rule: str, confidence: float, note: str
) -> Verdict:
    """The verdict as the context reads it instead."""
    return replace(
        v, cls=cls, retryable=retryable, rule=rule, confidence=confidence, notes=(*v.notes, note)
    )


def _doubt(v: Verdict, note: str) -> Verdict:
    """The same verdict, uncertain: a retryable one is retried once."""
    return replace(v, confidence=min(v.confidence, 0.5), notes=(*v.notes, note))


def _in_context(v: Verdict, lines: tuple[str, ...], phase: Phase) -> Verdict:
    """What the rest of the log changes about a signature's verdict."""
    m = v.matched
    if v.cls is FailureClass.DEVICE_OOM:
        held = gpu_held_elsewhere(lines)
        if held is not None:
            return _reread(v, FailureClass.CAPACITY, True, "gpu-memory-held-elsewhere", 0.7, held)
    if v.rule in _COLLECTIVE_RULES:
        why = collective_mismatch(lines)
        if why is not None:
            note = f"{why}: a bug, not the network"
            return _reread(v, FailureClass.USER_ERROR, False, "collective-mismatch", 0.75, note)
        if phase is not Phase.TRAINING and first_collectives(lines):
            return _doubt(v, "failed in the first collectives, before any step: retried once")
        solo = solo_work_before_timeout(lines)
        if solo is not None:
            return _doubt(
                v,
                f"the timeout follows work some ranks do alone ({_short(solo, 80)!r}): "
                "retried once",
            )
    if m is not None and m.untrained is not None and phase is not Phase.TRAINING:
        u = m.untrained
        note = f"no training step before it: {u.reason}"
        cls = FailureClass(u.failure_class)
        return _reread(v, cls, u.retryable, f"{m.id}-untrained", u.confidence, note)
    return v


def _shell_killed(lines: tuple[str, ...]) -> bool:
    return any(_KILLED.search(clean(x)) for x in lines[-5:])


_KILLED = re.compile(r"(^|[\]*\s])(Killed|已杀死)\**\s*$")


_DYING_WORDS = 12
"""Lines a dying process may print after its traceback (DDP and gloo shutdown noise)."""


def failed_before_stop(ev: ExitEvidence, rules: Rules | None = None) -> Classification | None:
    """A replica the master stopped that had already failed on its own: what it died of.

    Its last words are an uncaught traceback that is not a peer's cascade (a KeyError, a
    timeout of its own): the stop only overtook its exit, on a busy machine by seconds.
    Counting it keeps the root cause right when its peer's cascade was seen first.
    """
    if not ev.stop_requested or ev.returncode == 0:
        return None
    block = exception_block(ev.log_tail)
    if block is None or len(ev.log_tail) - (block[1] + 1) > _DYING_WORDS:
        return None
    # It was dying of the exception: it would have exited 1, whatever the stop's signal.
    own = classify_exit(replace(ev, stop_requested=False, returncode=1), rules)
    if not own.is_failure or own.cascade or own.matched_line is None:
        return None
    return replace(own, notes=(*own.notes, "it had failed on its own when the stop reached it"))


def internal_failure(exc: BaseException) -> Classification:
    """A fault of trainguard or its backend, not of the job (retried twice, as Vertex)."""
    reason = f"{type(exc).__name__}: {exc}"
    return Classification(
        ExitKind.NONZERO,
        FailureClass.INTERNAL,
        True,
        "internal-error",
        None,
        None,
        reason,
        INTERNAL_ERROR_MESSAGE,
        fingerprint=fingerprint(f"internal:{type(exc).__name__}"),
    )


def hang_failure(
    kind: str,
    replica: str,
    interval_s: float,
    idle_s: float,
    summary: str,
    where: str,
    finished: str | None = None,
) -> Classification:
    """A hang (no sign of life) or an exit hang (peers do not finish) is retryable.

    `where` (the culprit's innermost own frame) makes the fingerprint, so a rank that
    hangs at the same place again counts as the same error.
    """
    if kind == "exit_hang":
        cls, rule = FailureClass.EXIT_HANG, "exit-hang-detector"
        reason = f"{replica} finished but the other replicas did not exit within {interval_s:g} s"
    elif kind == "startup_hang":
        cls, rule = FailureClass.HANG, "startup-hang-detector"
        reason = (
            f"no replica showed a sign of life (a line of output or an SDK call) within "
            f"{interval_s:g} s of starting (startup_timeout_s)"
        )
    else:
        cls, rule = FailureClass.HANG, "hang-detector"
        reason = (
            f"no output or heartbeat from any replica for {idle_s:.0f} s "
            f"(interval {interval_s:g} s)"
        )
    message = f"The job hung: {reason}."
    if summary:
        message += f" Diagnosis: {summary}."
    return Classification(
        ExitKind.HANG,
        cls,
        True,
        rule,
        None,
        None,
        reason,
        message,
        matched_line=summary or None,
        fingerprint=fingerprint(f"{cls}:{replica}:{where}"),
    )
