"""The learned second opinion (issue 13): trained on the real corpus' development part only,
reproducible, consulted only where the rules are unsure, and explaining every override."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from corpus_real_eval import MODEL, digest, load, train

from trainguard.classify import learned
from trainguard.classify.classes import ExitEvidence, ExitKind, FailureClass
from trainguard.classify.exits import classify_by_rules, classify_exit
from trainguard.policy.outcome import first_decision, retries
from trainguard.spec.models import FaultTolerance

TIMEOUT = (
    "[E ProcessGroupNCCL.cpp:475] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=88, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600046 milliseconds "
    "before timing out."
)


@pytest.mark.no_cover  # a training run: 3x slower traced, and other tests cover it
def test_the_shipped_model_is_the_one_the_development_part_trains() -> None:
    cases = load()
    shipped = learned.default()
    assert shipped.trained_on == digest(cases), (
        "the corpus changed: retrain with `python tests/support/corpus_real_eval.py --train`"
    )
    dev = {c.url for c in cases if c.split == "dev"}
    assert {k.url for k in shipped.known} <= dev  # never a test case
    assert len(shipped.known) == sum(c.split == "dev" for c in cases)
    # training is deterministic: the file is exactly what the script writes
    assert learned.to_dict(train(cases)) == json.loads(MODEL.read_text())


def _example(words: str, retryable: bool, rules_retryable: bool) -> learned.Example:
    rules = classify_by_rules(ExitEvidence("w", 1, log_tail=("x",)))
    return learned.Example((words,), replace(rules, retryable=rules_retryable), retryable)


def test_training_learns_words_and_is_deterministic() -> None:
    good = "bucket returned service unavailable please retry later throttled"
    bad = "keyerror missing column in your dataset config typo"
    examples = [_example(good, True, False), _example(bad, False, False)] * 6
    m1 = learned.train(examples, min_df=1)
    m2 = learned.train(examples, min_df=1)
    assert learned.to_dict(m1) == learned.to_dict(m2)
    rules = examples[0].rules
    assert m1.opinion(m1.vector((good,)), rules).probability > 0.7
    assert m1.opinion(m1.vector((bad,)), rules).probability < 0.3
    words = dict(m1.opinion(m1.vector((good,)), rules).words)
    assert all(v > 0 for v in words.values()) and words


def test_only_the_failure_is_read_not_what_the_job_survived() -> None:
    lines = ("Traceback (most recent call last):", "KeyError: 'x'", "step 10 loss 0.1", "boom")
    assert learned.failure_lines(lines) == ["boom"]
    assert learned.failure_lines(("a", "", "b")) == ["a", "b"]
    assert set(learned.terms(("Connection reset by peer",))) >= {"connection", "reset by"}


BUG = (
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    '    x = cfg["lr"]',
    "KeyError: 'lr'",
)


def test_confident_rules_and_exits_that_are_not_read_stay_as_they_are() -> None:
    sure = classify_by_rules(ExitEvidence("w", 1, log_tail=BUG))
    assert sure.confidence >= learned.SURE and not sure.retryable
    assert classify_exit(ExitEvidence("w", 1, log_tail=BUG)) == sure  # the model agrees
    for ev in (
        ExitEvidence("w", 0, log_tail=(TIMEOUT,)),
        ExitEvidence("w", -15, stop_requested=True, log_tail=(TIMEOUT,)),
        ExitEvidence("w", None, spawn_error="no such file", log_tail=(TIMEOUT,)),
        ExitEvidence("w", 1, node_lost="gone", log_tail=(TIMEOUT,)),
        ExitEvidence("w", -11, log_tail=("Segmentation fault (core dumped)",)),  # says too little
    ):
        assert classify_exit(ev) == classify_by_rules(ev)


def test_a_sure_stop_the_model_doubts_is_no_proof_and_gets_one_retry() -> None:
    """A bare CUDA OOM: the rules stop it surely, but the model, trained on outcomes, gives
    a retry a real chance (memory held by another process): uncertain, the class kept."""
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",) * 3
    sure = classify_by_rules(ExitEvidence("w", 1, log_tail=log))
    doubted = classify_exit(ExitEvidence("w", 1, log_tail=log))
    assert sure.confidence >= learned.SURE and not sure.retryable
    assert doubted.uncertain and not doubted.retryable
    assert (doubted.failure_class, doubted.rule) == (sure.failure_class, sure.rule)
    assert "is not proof enough to end the job" in doubted.notes[-1]
    assert retries(first_decision(doubted))
    assert not retries(first_decision(doubted, FaultTolerance(retry_uncertain=False)))


def test_an_override_is_uncertain_and_says_what_decided_it() -> None:
    ev = ExitEvidence("worker-1", 1, log_tail=(TIMEOUT,))
    rules = classify_by_rules(ev)
    assert rules.retryable and rules.confidence < learned.SURE
    c = classify_exit(ev)
    assert c.kind is ExitKind.NONZERO
    assert (c.failure_class, c.retryable) == (FailureClass.USER_ERROR, False)
    assert c.rule == f"learned-model({rules.rule})"
    assert c.uncertain and c.fingerprint == rules.fingerprint
    (note,) = [n for n in c.notes if n.startswith("learned model")]
    assert "nearest known cases https://github.com/" in note
    assert note.endswith(f"overrules {rules.rule}")


def test_agreement_keeps_the_rules_verdict_and_notes_it() -> None:
    rules = classify_by_rules(ExitEvidence("w", 1, log_tail=(TIMEOUT,)))
    assert rules.retryable and rules.confidence < learned.SURE
    lines = (TIMEOUT, "connection reset by peer while reading the socket of rank three")
    # a model that always says "retry", knowing every word of the log
    model = learned.Model(idf=dict.fromkeys(learned.terms(lines), 1.0), weights={}, bias=5.0)
    c = learned.reconsider(rules, lines, model)
    assert (c.failure_class, c.retryable, c.rule) == (rules.failure_class, True, rules.rule)
    assert c.notes[-1].endswith(": agrees")
    # the same model knowing one word only does not read the log at all
    terse = learned.Model(idf={"timeout": 1.0}, weights={}, bias=-5.0)
    assert len(terse.vector(lines)) < learned.MIN_TERMS
    assert learned.reconsider(rules, lines, terse) == rules
