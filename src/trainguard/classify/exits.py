"""Failure classification (R-CLS-1, R-CLS-2): pure, no processes, no clock, no files.

Every replica exit becomes a `Classification`: what kind of exit it was, its failure
class, whether a retry can help, which rule said so on which log line, and a
fingerprint for counting "the same error". The evidence is weighed in this order:

1. the exit itself: a clean exit, a stop the master asked for, a command that never
   started (an internal error where the master's machine ran out of descriptors or
   processes: `own_errors`), a replica that died with the master's own warm-start
   process (an internal error; a host OOM where the OOM-kill counter rose);
2. the job's own retryable keywords, anywhere in the tail;
3. a SIGKILL while the cgroup's OOM-kill counter rose: host OOM;
4. the catalogue (signatures.yaml), first on the exception that closes the last
   traceback, then on the lines from that traceback on (the whole tail if none),
   newest first. A death by signal is not explained by a bug the log mentions; a port in
   use that trainguard chose for the attempt is a race, retried (`own_ports`);
5. the exit code: SIGSEGV/SIGABRT are transient (surely so at exit, once every other
   replica exited 0), SIGKILL/SIGTERM from outside are
   preemption, anything else is a user error (a traceback names it);
6. where the rules are unsure (confidence under 0.7), a small learned model of real
   logs reads the tail as a second opinion; a retry it grants is granted once;
7. the machine's readings at the failure (kernel log, cgroup, disk, GPUs, the signal's
   sender) settle what the log could not (`classify.machine`).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import replace

from trainguard.classify.catalogue import Rules
from trainguard.classify.classes import (
    INTERNAL_ERROR_MESSAGE,
    Classification,
    ExitEvidence,
    ExitKind,
    FailureClass,
    exit_message,
)
from trainguard.classify.evidence import weigh
from trainguard.classify.fingerprint import fingerprint
from trainguard.classify.learned import reconsider
from trainguard.classify.logcontext import phase_of
from trainguard.classify.logtail import exception_block, may_end_in_traceback
from trainguard.classify.machine import weigh_machine
from trainguard.classify.own_errors import is_own_resource_errno, own_resource_text
from trainguard.signals import decode_returncode, signal_name


def classify_exit(ev: ExitEvidence, rules: Rules | None = None) -> Classification:
    """Classify one exit from its evidence alone: the rules, then, where they are unsure,
    the learned model's reading of the log (`trainguard.classify.learned`), then what the
    machine said (`trainguard.classify.machine`; nothing where it said nothing)."""
    return weigh_machine(reconsider(classify_by_rules(ev, rules), ev.log_tail), ev)


def classify_by_rules(ev: ExitEvidence, rules: Rules | None = None) -> Classification:
    """The rules' classification alone (what the learned model is trained to second)."""
    if ev.returncode is None and ev.spawn_errno and is_own_resource_errno(ev.spawn_errno):
        return own_spawn_failure(ev.replica, ev.spawn_errno)
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
    how = ev.zygote_died if sig == signal.SIGKILL else None
    if how is not None:
        return zygote_failure(ev, code, how)

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
        exit_message(ev.replica, code, v.cls, v.reason),
        matched_line=v.line,
        fingerprint=fingerprint(f"{v.cls}:{v.line or v.reason}"),
        cascade=bool(v.matched and v.matched.cascade),
        hardware=bool(v.matched and v.matched.hardware),
        confidence=v.confidence,
        phase=phase.value,
        notes=v.notes,
    )


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
    if not may_end_in_traceback(ev.log_tail, _DYING_WORDS):
        return None
    block = exception_block(ev.log_tail)
    if block is None or len(ev.log_tail) - (block[1] + 1) > _DYING_WORDS:
        return None
    # It was dying of the exception: it would have exited 1, whatever the stop's signal.
    own = classify_exit(replace(ev, stop_requested=False, returncode=1), rules)
    if not own.is_failure or own.cascade or own.matched_line is None:
        return None
    return replace(own, notes=(*own.notes, "it had failed on its own when the stop reached it"))


def quiet_stop(ev: ExitEvidence) -> Classification | None:
    """A stop's exit that shows no failure of its own (no traceback at the end of its
    tail): what `failed_before_stop`, then `classify_exit`, make of it whatever the rules and
    whatever the master adds to the evidence (the rules and the annotations are never
    read on this path). None: classify it in full. A stop of 1,024 ranks settles 1,023
    such exits while the restart waits."""
    if not ev.stop_requested or ev.returncode in (None, 0) or ev.node_lost is not None:
        return None
    if may_end_in_traceback(ev.log_tail, _DYING_WORDS):
        return None  # it may have been dying of its own error
    return classify_exit(ev)


def own_spawn_failure(replica: str, code: int) -> Classification:
    """The master's machine ran out of something starting the replica (EMFILE, EAGAIN):
    an internal error of this machine, retried as one; never the job's nor a node's."""
    what = own_resource_text(code)
    reason = f"the master could not start {replica}: {what}"
    return Classification(
        ExitKind.SPAWN_ERROR,
        FailureClass.INTERNAL,
        True,
        "own-resources",
        None,
        None,
        reason,
        f"{INTERNAL_ERROR_MESSAGE} Termination reason: {reason}.",
        fingerprint=fingerprint(f"internal:spawn:{what}"),
    )


def zygote_failure(ev: ExitEvidence, code: int, how: str) -> Classification:
    """The replica died with the preload process that forked it (`how` it died): the
    master's own process, so an internal error, retried as one; where the OOM-kill
    counter rose meanwhile, the kernel chose the zygote (it holds torch) for a host OOM."""
    if ev.oom_kills > 0:
        reason = (
            "the preload process (the zygote that forked this replica) was killed by the "
            "kernel's OOM killer; the replica died with it"
        )
        message = (
            f"The replica {ev.replica} ran out of memory: the kernel's OOM killer killed the "
            f"preload process (the zygote that forked it), and the replica died with it "
            f"(exit status {code})."
        )
        return Classification(
            ExitKind.SIGNAL,
            FailureClass.HOST_OOM,
            False,
            "zygote-oom",
            code,
            "SIGKILL",
            reason,
            message,
            fingerprint=fingerprint("host_oom:zygote"),
            confidence=0.99,
        )
    reason = f"the preload process (the zygote that forked {ev.replica}) was {how}"
    return Classification(
        ExitKind.SIGNAL,
        FailureClass.INTERNAL,
        True,
        "zygote-died",
        code,
        "SIGKILL",
        reason,
        f"{INTERNAL_ERROR_MESSAGE} Termination reason: {reason}; the replica died with it.",
        fingerprint=fingerprint(f"internal:zygote:{how}"),
        confidence=0.95,
    )


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
    group: tuple[int, Sequence[str]] | None = None,
) -> Classification:
    """A hang (no sign of life) or an exit hang (peers do not finish) is retryable.

    `group`: the replica group (its number and members) whose watch saw the silence.

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
    if group is not None:
        g, members = group
        who = "its replica" if len(members) == 1 else "any of its replicas"
        reason = reason.replace("any replica", f"{who} ({', '.join(members)})")
        message = f"Replica group {g} hung: {reason}."
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
