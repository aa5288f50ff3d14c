"""A replica that died with the master's own warm-start process (the zygote that forked
it): an internal error, retryable and charged as one, its message naming the zygote;
where the OOM-kill counter rose, a host OOM (issue 37). Never a preemption."""

from __future__ import annotations

import signal

from trainguard.classify.classes import ExitEvidence, ExitKind, FailureClass
from trainguard.classify.exits import classify_exit
from trainguard.classify.own_errors import zygote_death_note
from trainguard.policy.actions import RestartJob, describe
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure, error_code
from trainguard.spec.models import FaultTolerance
from trainguard.states import ErrorCode

NOTE = zygote_death_note("killed by SIGKILL")
TAIL = ("step 3 loss 0.5", "step 4 loss 0.4", NOTE)


def _ev(
    tail: tuple[str, ...] = TAIL,
    oom_kills: int = 0,
    code: int = -signal.SIGKILL,
    how: str | None = "killed by SIGKILL",
) -> ExitEvidence:
    return ExitEvidence("worker-0", code, log_tail=tail, oom_kills=oom_kills, zygote_died=how)


def test_the_note_is_the_one_the_backend_wrote() -> None:
    assert NOTE == (
        "trainguard: the preload process (the zygote that forked this replica) was "
        "killed by SIGKILL; the replica died with it"
    )


def test_a_zygote_killed_by_sigkill_is_an_internal_error_naming_it() -> None:
    c = classify_exit(_ev())
    assert (c.kind, c.failure_class, c.retryable) == (ExitKind.SIGNAL, FailureClass.INTERNAL, True)
    assert c.rule == "zygote-died" and c.failure_class is not FailureClass.PREEMPTION
    assert c.exit_code == 137 and c.signal == "SIGKILL"
    assert "preload process (the zygote that forked worker-0) was killed by SIGKILL" in c.message
    assert c.message.startswith("Internal error occurred for the current attempt.")
    assert not c.uncertain
    assert error_code(c) == ErrorCode.INTERNAL
    failure = Failure("worker-0", "worker", 0, 0, 1, 0.0, c, log_tail=TAIL)
    d = decide_failure(FaultTolerance(), Budgets(), failure)
    assert isinstance(d, RestartJob) and "max_internal_restarts 1/" in describe(d), describe(d)


def test_a_zygote_the_oom_killer_chose_is_a_host_oom_naming_it() -> None:
    c = classify_exit(_ev(oom_kills=1))
    assert (c.failure_class, c.retryable, c.rule) == (FailureClass.HOST_OOM, False, "zygote-oom")
    assert "OOM killer killed the preload process (the zygote that forked it)" in c.message
    assert c.exit_code == 137


def test_no_sigkill_or_only_the_words_are_no_zygote_death() -> None:
    """The backend says it (`ExitEvidence.zygote_died`); a replica that prints the note
    itself and is killed is no zygote death."""
    assert classify_exit(_ev(code=1)).rule != "zygote-died"
    assert classify_exit(_ev(how=None)).rule != "zygote-died"
    assert classify_exit(_ev(tail=(NOTE, "Killed"))).rule == "zygote-died"


def test_a_plain_external_sigkill_is_still_a_preemption() -> None:
    c = classify_exit(_ev(tail=("step 3 loss 0.5",), how=None))
    assert (c.failure_class, c.rule) == (FailureClass.PREEMPTION, "external-SIGKILL")
