"""Table tests for exit classification (R-CLS-1, R-CLS-2): no processes (signal spellings:
tests/unit/test_signals.py; what the catalogue reads in real log lines:
tests/unit/test_catalogue_lines.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trainguard.classify.catalogue import Rules
from trainguard.classify.classes import Classification, ExitEvidence, ExitKind, FailureClass
from trainguard.classify.exits import classify_exit, failed_before_stop, quiet_stop

REPLICA = "worker-1"

TRACEBACK_KEYERROR = (
    "step 10 loss 0.5",
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 12, in <module>',
    "    main()",
    '  File "/app/train.py", line 8, in main',
    "    batch = cfg['x']",
    "            ~~~^^^^^",
    "KeyError: 'x'",
)


def _classify(returncode: int | None, **kw: Any) -> Classification:
    return classify_exit(ExitEvidence(REPLICA, returncode, **kw))


# ---------------------------------------------------------------- classify_exit


def test_clean_exit() -> None:
    c = _classify(0)
    assert c.kind is ExitKind.CLEAN
    assert c.failure_class is None
    assert c.is_failure is False
    assert c.retryable is False
    assert c.exit_code == 0
    assert c.signal is None
    assert c.rule == "clean-exit"


def test_asked_to_stop_but_finished_first_is_a_clean_exit() -> None:
    c = _classify(0, stop_requested=True)
    assert (c.kind, c.is_failure) == (ExitKind.CLEAN, False)


@pytest.mark.parametrize("returncode", [-15, 143, -9, 1])
def test_stop_requested_is_never_a_failure(returncode: int) -> None:
    c = _classify(returncode, stop_requested=True)
    assert c.kind is ExitKind.STOP_REQUESTED
    assert c.failure_class is None
    assert c.is_failure is False
    assert c.retryable is False
    assert c.rule == "stop-requested"


def test_stop_requested_sigterm_keeps_its_code() -> None:
    c = _classify(-15, stop_requested=True)
    assert (c.exit_code, c.signal) == (143, "SIGTERM")


@pytest.mark.parametrize(
    ("returncode", "code", "sig"),
    [
        (-11, 139, "SIGSEGV"),
        (139, 139, "SIGSEGV"),
        (-6, 134, "SIGABRT"),
        (134, 134, "SIGABRT"),
    ],
)
def test_transient_signals(returncode: int, code: int, sig: str) -> None:
    # a traceback long before the death does not explain it: the signal decides
    old = (*TRACEBACK_KEYERROR, *(f"step {i} loss 0.1" for i in range(10)))
    c = _classify(returncode, log_tail=old)
    assert c.kind is ExitKind.SIGNAL
    assert c.failure_class is FailureClass.TRANSIENT_EXIT
    assert c.is_failure is True
    assert c.retryable is True
    assert c.exit_code == code
    assert c.signal == sig
    assert c.reason == sig
    assert c.rule == f"transient-signal-{sig}"
    assert c.message == (
        f"The replica worker-1 exited with a non-zero status of {code}. Termination reason: {sig}."
    )


def test_sigsegv_message_exactly() -> None:
    for rc in (-11, 139):
        assert _classify(rc).message == (
            "The replica worker-1 exited with a non-zero status of 139. "
            "Termination reason: SIGSEGV."
        )


@pytest.mark.parametrize(
    ("returncode", "code", "sig"),
    [
        (-9, 137, "SIGKILL"),
        (137, 137, "SIGKILL"),
        (-15, 143, "SIGTERM"),
        (143, 143, "SIGTERM"),
        (-2, 130, "SIGINT"),
    ],
)
def test_external_kill_is_preemption(returncode: int, code: int, sig: str) -> None:
    c = _classify(returncode)
    assert c.kind is ExitKind.SIGNAL
    assert c.failure_class is FailureClass.PREEMPTION
    assert c.retryable is True
    assert c.exit_code == code
    assert c.signal == sig
    assert c.rule == f"external-{sig}"
    assert sig in c.message
    assert c.message == (
        f"The replica worker-1 exited with a non-zero status of {code}. "
        f"Termination reason: {sig} (killed from outside trainguard)."
    )


@pytest.mark.parametrize("returncode", [-9, 137])
def test_sigkill_with_oom_kill_is_host_oom(returncode: int) -> None:
    c = _classify(returncode, oom_kills=1)
    assert c.failure_class is FailureClass.HOST_OOM
    assert c.retryable is False  # as Vertex: the same job on the same machine runs out again
    assert c.rule == "host-oom-cgroup"
    assert c.reason == "OOMKilled"
    assert c.exit_code == 137
    assert c.signal == "SIGKILL"
    assert c.message == (
        "The replica worker-1 ran out of memory and exited with a non-zero status of 137."
    )


def test_oom_kill_does_not_turn_sigterm_into_oom() -> None:
    c = _classify(-15, oom_kills=2)
    assert c.failure_class is FailureClass.PREEMPTION


def test_exit_1_with_traceback_is_user_error() -> None:
    c = _classify(1, log_tail=TRACEBACK_KEYERROR)
    assert c.kind is ExitKind.NONZERO
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.retryable is False
    assert c.rule == "python-bug"  # the catalogue's signature for common Python exceptions
    assert c.reason == "KeyError: 'x'"
    assert c.matched_line == "KeyError: 'x'"
    assert c.exit_code == 1
    assert c.signal is None
    assert c.message == (
        "The replica worker-1 exited with a non-zero status of 1. "
        "Termination reason: KeyError: 'x'."
    )


@pytest.mark.parametrize("returncode", [1, 2, 128, 255])
def test_nonzero_without_traceback_is_user_error(returncode: int) -> None:
    c = _classify(returncode, log_tail=("loading data", "giving up"))
    assert c.kind is ExitKind.NONZERO
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.retryable is False
    assert c.rule == "nonzero-exit"
    assert c.reason == "Error"
    assert c.matched_line is None
    assert c.exit_code == returncode
    assert c.signal is None
    assert c.message == (
        f"The replica worker-1 exited with a non-zero status of {returncode}. "
        "Termination reason: Error."
    )


def test_spawn_error() -> None:
    c = _classify(None, spawn_error="command not found: 'nope'")
    assert c.kind is ExitKind.SPAWN_ERROR
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.is_failure is True
    assert c.retryable is False
    assert c.rule == "spawn-error"
    assert c.exit_code is None
    assert c.signal is None
    assert c.reason == "command not found: 'nope'"
    assert c.message == "The replica worker-1 could not be started: command not found: 'nope'."


def test_spawn_error_without_detail() -> None:
    c = _classify(None)
    assert c.kind is ExitKind.SPAWN_ERROR
    assert c.reason == "the command could not be started"


@pytest.mark.parametrize("returncode", [-7, 135])
def test_sigbus_is_not_transient_by_default(returncode: int) -> None:
    # TRANSIENT_SIGNALS is SIGABRT and SIGSEGV only; any other signal not sent from outside
    # (SIGKILL/SIGTERM/SIGINT) is the program's own fault: a user error, not retried.
    c = _classify(returncode)
    assert c.kind is ExitKind.SIGNAL
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.retryable is False
    assert c.rule == "other-signal"
    assert c.reason == "SIGBUS"
    assert c.exit_code == 135
    assert c.signal == "SIGBUS"
    assert c.message == (
        "The replica worker-1 exited with a non-zero status of 135. Termination reason: SIGBUS."
    )


def test_sigbus_with_traceback_reports_the_exception() -> None:
    c = _classify(-7, log_tail=TRACEBACK_KEYERROR)
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.rule == "python-traceback"
    assert c.reason == "KeyError: 'x'"


@pytest.mark.parametrize("returncode", [-6, 134])
def test_an_uncaught_exception_then_an_abort_at_exit_is_the_exception(returncode: int) -> None:
    """gloo's threads make the interpreter abort on its way out after an uncaught error."""
    tail = (
        "step 19 loss 0.2",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 113, in main',
        "[rank1]: KeyError: 'lr'",
        "terminate called without an active exception",
    )
    c = _classify(returncode, log_tail=tail)
    assert (c.failure_class, c.retryable, c.reason) == (
        FailureClass.USER_ERROR,
        False,
        "KeyError: 'lr'",
    )


def test_an_old_traceback_long_before_a_segfault_does_not_explain_it() -> None:
    tail = (
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "KeyError: 'x'",
        *(f"step {i} loss 0.1" for i in range(20)),
    )
    assert _classify(-11, log_tail=tail).failure_class is FailureClass.TRANSIENT_EXIT


# What rank 1 of a Lightning DDP job printed before it aborted at exit in a CI run, its
# peer having exited 0 (the gloo-threads-at-exit race of pytorch/pytorch#179291).
_LIGHTNING_ABORT_AT_EXIT = (
    "GPU available: False, used: False",
    "TPU available: False, using: 0 TPU cores",
    "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2",
    "`Trainer.fit` stopped: `max_epochs=2` reached.",
    "weights of rank 1: 0.1234567",
    "terminate called without an active exception",
)


@pytest.mark.parametrize("returncode", [-6, -11])
def test_a_bare_crash_after_every_peer_finished_is_a_crash_at_exit(returncode: int) -> None:
    ev = ExitEvidence("worker-1", returncode, log_tail=_LIGHTNING_ABORT_AT_EXIT, progressed=True)
    alone = classify_exit(ev)
    assert "transient-signal" in alone.rule and alone.confidence < 0.7
    c = classify_exit(ExitEvidence(**{**ev.__dict__, "peers_finished": True}))
    assert c.failure_class is FailureClass.TRANSIENT_EXIT and c.retryable
    assert c.rule == f"crash-at-exit-{c.signal}" and c.confidence >= 0.7
    assert "after every other replica had finished" in c.notes[-1]


def test_peers_that_finished_do_not_excuse_a_crash_with_a_cause() -> None:
    tail = ("RuntimeError: CUDA error: device-side assert triggered", "Aborted (core dumped)")
    c = classify_exit(ExitEvidence("worker-1", -6, log_tail=tail, peers_finished=True))
    assert not c.retryable and c.rule != "crash-at-exit-SIGABRT"


def test_a_reason_that_ends_its_own_sentence_gets_one_full_stop() -> None:
    c = _classify(1, log_tail=("ORTE has lost communication with a remote daemon.",))
    assert c.message.endswith(
        "Termination reason: ORTE has lost communication with a remote daemon."
    )


def test_a_quiet_stop_is_classified_from_the_exit_alone() -> None:
    """`quiet_stop`: what the full classification of a stop's exit gives (the rules, the
    master's annotations and the traceback read skipped); None wherever they could matter."""
    quiet = ExitEvidence("w", -15, stop_requested=True, log_tail=("step 3 loss 0.1",) * 30)
    annotated = replace(quiet, own_ports=(29500,), progressed=True, peers_finished=True)
    rules = Rules.default(("loss",))  # a keyword its tail matches changes nothing either
    c = quiet_stop(quiet)
    assert c is not None and c.kind is ExitKind.STOP_REQUESTED and not c.is_failure
    assert c == classify_exit(annotated, rules) and failed_before_stop(annotated, rules) is None
    bug = ("Traceback (most recent call last):", '  File "t.py", line 3', "KeyError: 'lr'")
    assert quiet_stop(replace(quiet, log_tail=bug)) is None  # maybe dying of its own error
    assert quiet_stop(replace(quiet, returncode=0)) is None  # it finished: a clean exit
    assert quiet_stop(replace(quiet, returncode=None)) is None  # it never started
    assert quiet_stop(replace(quiet, node_lost="its agent went silent")) is None
    assert quiet_stop(replace(quiet, stop_requested=False)) is None  # not our stop
