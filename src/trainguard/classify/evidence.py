"""Weighing the evidence of one failed exit (R-CLS-2): the catalogue's match, read in the
context of the log (phase, wrappers, collective mismatches, crash causes, memory held
elsewhere), becomes a `Verdict` with a confidence."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, replace

from trainguard.classify.catalogue import Rules, Signature, first_match
from trainguard.classify.classes import (
    EXTERNAL_KILL_SIGNALS,
    TRANSIENT_SIGNALS,
    ExitEvidence,
    FailureClass,
    short_line,
)
from trainguard.classify.logcontext import (
    Phase,
    child_signal,
    collective_mismatch,
    crash_cause,
    first_collectives,
    gpu_held_elsewhere,
    root_exception_block,
    solo_work_before_timeout,
)
from trainguard.classify.logtail import clean, exception_block
from trainguard.signals import signal_name

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
    child = child_signal(lines)  # what a launcher's summary says its child died of
    if sig is None:  # a launcher that exits 1 may say which signal its child died of
        sig = _signal_number(child)
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
                short_line(line),
                matched.confidence,
                line,
                matched,
                tuple(notes),
            )
            return (
                _port_race(v, lines, ev.own_ports)
                or _slurm_teardown(v, ev, rules, phase)
                or _in_context(v, lines, phase)
            )
        notes.append(f"{matched.id} on {short_line(line, 80)!r} does not explain a death by signal")
    if sig is not None and sig in TRANSIENT_SIGNALS:
        cause = crash_cause(lines)
        if cause is not None:
            return Verdict(
                FailureClass.USER_ERROR,
                False,
                f"crash-with-cause-{sig_name}",
                short_line(cause),
                0.7,
                cause,
                notes=(*notes, f"{sig_name} follows a deterministic cause in the log"),
            )
        if ev.peers_finished:
            # pytorch/pytorch#179291: gloo or NCCL threads still running while the
            # interpreter shuts down; the training itself ran to its end on every rank
            return Verdict(
                FailureClass.TRANSIENT_EXIT,
                True,
                f"crash-at-exit-{sig_name}",
                str(sig_name),
                0.8,
                notes=(
                    *notes,
                    f"{sig_name} with no cause in the log after every other replica had "
                    "finished: a crash at exit (native threads still running), not a bug of "
                    "the training",
                ),
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
    if sig == signal.SIGKILL and child == "SIGKILL":
        return Verdict(
            FailureClass.HOST_OOM,
            False,
            "child-killed-under-launcher",
            "a launcher's child was SIGKILLed",
            0.6,
            notes=(
                *notes,
                "a launcher lived to report that one child was SIGKILLed: a kill of one "
                "process, as the kernel's OOM killer makes (a preemption or a lost node "
                "stops them all)",
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
            short_line(line),
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
                f"the timeout follows work some ranks do alone ({short_line(solo, 80)!r}): "
                "retried once",
            )
    if m is not None and m.untrained is not None and phase is not Phase.TRAINING:
        u = m.untrained
        note = f"no training step before it: {u.reason}"
        cls = FailureClass(u.failure_class)
        return _reread(v, cls, u.retryable, f"{m.id}-untrained", u.confidence, note)
    return v


def _port_race(v: Verdict, lines: tuple[str, ...], ours: tuple[int, ...]) -> Verdict | None:
    """A port in use that trainguard chose itself for this attempt: another process took it
    between the choice and the bind (the OS hands the same ports out to anyone). The next
    attempt gets a fresh port; a port the job fixed itself stays a set-up error."""
    if v.rule != "port-in-use" or not ours:
        return None
    named = re.compile(rf"(?<![\d.])({'|'.join(map(str, ours))})(?!\d)")
    for line in reversed(lines):
        text = clean(line)
        found = named.search(text)
        if found and _BINDING.search(text):
            port = found.group(1)
            note = (
                f"port {port} is one trainguard chose for this attempt: another process "
                "took it before the replica bound it; the next attempt draws a fresh one"
            )
            again = _reread(v, FailureClass.TRANSIENT_EXIT, True, "port-race", 0.75, note)
            reason = f"the port trainguard chose ({port}) was taken before it was bound"
            return replace(again, reason=reason)
    return None


_BINDING = re.compile(r"port|address|bind|listen", re.IGNORECASE)

_SRUN_TEARDOWN = re.compile(
    r"srun: (Terminating (StepId|job step)|error: .*: tasks? [\d,-]+: Exited with exit code [1-9])"
)


def _slurm_teardown(v: Verdict, ev: ExitEvidence, rules: Rules, phase: Phase) -> Verdict | None:
    """A SIGTERM that srun sent while it tore a step down after one of its tasks failed is
    srun's doing, not a preemption: the failure is what the log said before the teardown.
    Slurm's own preemption or time limit says so (`DUE TO ...`) and is kept."""
    if v.cls is not FailureClass.PREEMPTION or v.line is None or "DUE TO" in v.line:
        return None
    cleaned = [clean(x) for x in ev.log_tail]
    said = max((i for i, x in enumerate(cleaned) if x == v.line), default=0)
    down = next((i for i, x in enumerate(cleaned[:said]) if _SRUN_TEARDOWN.search(x)), None)
    if down is None:  # nothing before the line (or the line not found): nothing to re-read
        return None
    before = replace(ev, log_tail=ev.log_tail[:down])
    cause = weigh(before, None, rules, phase)
    note = (
        f"{short_line(v.line, 80)!r} came after srun tore the step down "
        f"({short_line(cleaned[down], 80)!r}): a task's failure, not a preemption"
    )
    return replace(cause, notes=(*cause.notes, note))


def _shell_killed(lines: tuple[str, ...]) -> bool:
    return any(_KILLED.search(clean(x)) for x in lines[-5:])


_KILLED = re.compile(r"(^|[\]*\s])(Killed|已杀死)\**\s*$")
