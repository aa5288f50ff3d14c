"""Weighing what the machine said at a failure (R-EVID-1, R-EVID-2): pure.

The log's verdict (`classify.exits`) is read again beside the machine's readings
(`ExitEvidence.machine`), in this order; where there are none, nothing changes (the corpus
of real logs sets none, so its numbers cannot move):

1. a full or read-only checkpoint or log path: a cause a person must fix, never retried
   blindly; the message says which path to free;
2. the kernel's OOM killer naming the replica (kernel log) or its own cgroup's counter:
   a host OOM, sure, whatever limit it hit (its own or the node's);
3. a GPU hardware fault: an Xid NVIDIA reads as the device's, a GPU that fell off the bus
   or vanished, uncorrectable ECC errors or pages pending retirement: hardware, retried
   off that device;
4. a segfault or CPU trap the kernel logged for the replica: the class stays, the library
   is named (and counts in the fingerprint: the same library crashing again is the same
   error);
5. who sent a SIGKILL/SIGTERM: trainguard (a stop), the scheduler (its notice in the log),
   the kernel (an OOM reading), or, by elimination once the kernel log and the cgroup were
   read, another process: an external kill, retryable and uncertain.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import replace

from trainguard.classify.classes import Classification, ExitEvidence, ExitKind, FailureClass
from trainguard.classify.classes import exit_message as _exit_message
from trainguard.classify.fingerprint import fingerprint
from trainguard.classify.readings import Finding, MachineReading, Source
from trainguard.signals import parse_signal

_KILLS = frozenset({signal.SIGKILL, signal.SIGTERM})
_GUESSED_KILLS = frozenset(
    {"external-SIGKILL", "external-SIGTERM", "killed-by-the-kernel", "child-killed-under-launcher"}
)
"""Verdicts the log alone reaches on a kill: an external kill, or an OOM guessed from the
shell's `Killed`; the readings settle which."""

_SCHEDULER_WORDS = ("DUE TO", "CANCELLED", "PREEMPT", "TIME LIMIT", "preempt")


def weigh_machine(c: Classification, ev: ExitEvidence) -> Classification:
    """`c` read again beside the machine's readings, which it then carries."""
    if not ev.machine:
        return c
    readings = list(ev.machine)
    if not c.is_failure or c.kind not in (ExitKind.SIGNAL, ExitKind.NONZERO):
        return replace(c, readings=tuple(readings))
    sig = _signal(c.signal)
    origin = signal_origin(ev, sig, readings, c)
    if origin is not None:
        readings.append(origin)
    out = (
        _storage(c, ev, readings)
        or _oom(c, ev, sig, readings)
        or _gpu(c, readings)
        or _crash(c, readings)
        or _external(c, ev, origin)
        or c
    )
    return replace(out, readings=tuple(readings))


def _signal(name: str | None) -> int | None:
    try:
        return parse_signal(name) if name else None
    except ValueError:
        return None


def _found(readings: Sequence[MachineReading], *findings: Finding) -> MachineReading | None:
    return next((r for r in readings if r.finding in findings and r.sure), None)


def _absent(readings: Sequence[MachineReading], source: Source) -> bool:
    mine = [r for r in readings if r.source == source]
    return not mine or all(r.finding is Finding.ABSENT for r in mine)


def _settled_bug(c: Classification) -> bool:
    """The log proves a bug of the job's own (a traceback, a sure signature)."""
    generic = ("nonzero-exit", "other-signal")
    return (
        c.failure_class is FailureClass.USER_ERROR and c.confidence >= 0.8 and c.rule not in generic
    )


def _reread(c: Classification, note: str, **changes: object) -> Classification:
    return replace(c, notes=(*c.notes, note), **changes)  # type: ignore[arg-type]


def _storage(
    c: Classification, ev: ExitEvidence, rs: Sequence[MachineReading]
) -> Classification | None:
    disk = _found(rs, Finding.DISK_FULL, Finding.READ_ONLY)
    if disk is None:
        return None
    said = _found([r for r in rs if r.source == Source.TAIL], disk.finding)
    if said is None and _settled_bug(c):
        return None  # a bug of its own, on a disk that also happens to be full
    path = disk.subject
    if disk.finding is Finding.DISK_FULL:
        reason = f"{path} is full"
        fix = f"Free space on {path}, then resume the job"
    else:
        reason = f"{path} is mounted read-only"
        fix = f"Make {path} writable, then resume the job"
    code = f"a non-zero status of {c.exit_code}" if c.exit_code is not None else "an error"
    message = f"The replica {ev.replica} exited with {code}: {reason} ({disk.value}). {fix}."
    note = f"{disk.value}: a cause a person must fix; a restart would fail the same way"
    return _reread(
        c,
        note,
        failure_class=FailureClass.USER_ERROR,
        retryable=False,
        rule="disk-full" if disk.finding is Finding.DISK_FULL else "read-only-storage",
        reason=reason,
        message=message,
        matched_line=said.value if said else c.matched_line,
        fingerprint=fingerprint(f"storage:{disk.finding}:{path}"),
        confidence=0.95,
        hardware=False,
        cascade=False,
    )


def _oom(
    c: Classification, ev: ExitEvidence, sig: int | None, rs: Sequence[MachineReading]
) -> Classification | None:
    kill = _found(rs, Finding.OOM_KILL)
    if kill is None or (sig != signal.SIGKILL and _settled_bug(c)):
        return None
    code = c.exit_code if c.exit_code is not None else 137
    where = "the kernel log" if kill.source == Source.KMSG else "its cgroup's oom_kill counter"
    return _reread(
        c,
        f"the kernel's OOM killer killed it ({where}): {kill.reading}",
        failure_class=FailureClass.HOST_OOM,
        retryable=False,
        rule="host-oom-kernel",
        reason="OOMKilled",
        message=_exit_message(ev.replica, code, FailureClass.HOST_OOM, "OOMKilled") + _held_to(rs),
        matched_line=kill.value,
        fingerprint=fingerprint("host_oom:OOMKilled"),
        confidence=0.99,
        hardware=False,
        cascade=False,
    )


_LIMIT = re.compile(r"held to its resources\.memory of ([^()]+?)(?: \(|$)")


def _held_to(rs: Sequence[MachineReading]) -> str:
    """ " It was held to its resources.memory of 64 MiB." where a reading says so."""
    for r in rs:
        m = _LIMIT.search(r.reading)
        if m:
            return f" It was held to its resources.memory of {m.group(1)}."
    return ""


def _gpu(c: Classification, rs: Sequence[MachineReading]) -> Classification | None:
    hardware = (Finding.GPU_LOST, Finding.GPU_MEMORY, Finding.GPU_RESET, Finding.XID)
    fault = _found(rs, *hardware)  # an Xid is sure only when NVIDIA reads it as the device's
    if fault is None or _settled_bug(c):
        return None
    out = _reread(
        c,
        f"{fault.source}: {fault.reading}: the device's fault, not the job's",
        failure_class=FailureClass.RETRYABLE_MESSAGE,
        retryable=True,
        rule="gpu-hardware",
        matched_line=fault.value,
        fingerprint=fingerprint(f"gpu-hardware:{fault.finding}:{fault.subject}"),
        confidence=0.95,
        hardware=True,
        cascade=False,
    )
    return _reason(out, fault.reading)


def _crash(c: Classification, rs: Sequence[MachineReading]) -> Classification | None:
    crash = _found(rs, Finding.SEGFAULT, Finding.TRAP)
    if crash is None:
        return None
    where = f" in {crash.subject}" if crash.subject else ""
    kind = "segfault" if crash.finding is Finding.SEGFAULT else "trap"
    cls = c.failure_class.value if c.failure_class else ""
    out = _reread(
        c,
        f"the kernel logged a {kind}{where}: {crash.reading}",
        fingerprint=fingerprint(f"{cls}:{kind}:{crash.subject or c.reason}"),
    )
    return _reason(out, f"{c.reason}: a {kind}{where}") if where else out


def _reason(c: Classification, reason: str) -> Classification:
    """`c` with a new termination reason, in its message too."""
    said = f"Termination reason: {c.reason}"
    message = c.message.replace(said, f"Termination reason: {reason}") if c.reason else c.message
    return replace(c, reason=reason, message=message)


def _external(
    c: Classification, ev: ExitEvidence, origin: MachineReading | None
) -> Classification | None:
    if origin is None or origin.finding is not Finding.SENT_BY_OTHER:
        return None
    if c.rule not in _GUESSED_KILLS:
        return None
    sig = c.signal or "a signal"
    reason = f"{sig} sent by another process (not trainguard, not the kernel's OOM killer)"
    code = c.exit_code if c.exit_code is not None else 137
    return _reread(
        c,
        f"{origin.value}: {origin.reading}",
        failure_class=FailureClass.PREEMPTION,
        retryable=True,
        rule="external-kill",
        reason=reason,
        # the log already read it as a kill from outside: the kernel log confirms it; a
        # kill the log guessed as the OOM killer's is one the evidence leaves unsettled
        confidence=c.confidence if c.rule.startswith("external-") else min(c.confidence, 0.5),
        message=_exit_message(ev.replica, code, FailureClass.PREEMPTION, reason),
        fingerprint=fingerprint(f"preemption:external:{sig}"),
    )


def signal_origin(
    ev: ExitEvidence, sig: int | None, rs: Sequence[MachineReading], c: Classification
) -> MachineReading | None:
    """Who sent the SIGKILL/SIGTERM that ended it, as far as the readings tell."""
    if sig not in _KILLS:
        return None
    name = signal.Signals(sig).name if sig is not None else "?"
    value = f"{name} (exit status {c.exit_code})"
    if ev.stop_requested:
        return MachineReading(
            Source.SIGNAL, value, "sent by trainguard (a stop)", True, Finding.SENT_BY_TRAINGUARD
        )
    oom = _found(rs, Finding.OOM_KILL)
    maybe = any(r.finding is Finding.OOM_KILL for r in rs)  # another process's, or shared
    if oom is not None or maybe or ev.oom_kills > 0:
        sure = oom is not None
        return MachineReading(
            Source.SIGNAL, value, "sent by the kernel (OOM killer)", sure, Finding.SENT_BY_KERNEL
        )
    line = c.matched_line or ""
    if c.failure_class is FailureClass.PREEMPTION and any(w in line for w in _SCHEDULER_WORDS):
        return MachineReading(
            Source.SIGNAL,
            value,
            f"sent by the scheduler ({line[:120]})",
            "DUE TO" in line,
            Finding.SENT_BY_SCHEDULER,
        )
    if _absent(rs, Source.KMSG):  # a global OOM kill shows there only
        reading = (
            "sent from outside trainguard (the kernel log could not be read: an OOM kill "
            "is not ruled out)"
        )
        return MachineReading(Source.SIGNAL, value, reading, False, Finding.ABSENT)
    return MachineReading(
        Source.SIGNAL,
        value,
        "sent by another process (no OOM kill in the kernel log or the cgroup)",
        False,
        Finding.SENT_BY_OTHER,
    )
