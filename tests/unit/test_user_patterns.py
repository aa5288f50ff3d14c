"""A user's retryable pattern cannot freeze the master: RE2, linear on any line."""

from __future__ import annotations

import time

from trainguard.classify.catalogue import Rules, compile_user_pattern
from trainguard.classify.classes import ExitEvidence, FailureClass
from trainguard.classify.exits import classify_exit
from trainguard.classify.logtail import Tail


def test_a_catastrophic_pattern_runs_in_linear_time() -> None:
    evil = "(a+)+$"  # exponential in a backtracking engine on 'aaaa...b'
    line = "a" * 4000 + "b"
    rules = Rules.default((evil,))
    tail = Tail()  # what the master hands the classifier: its bounds (64 KiB) hold
    for _ in range(200):
        tail.append(line)
    t0 = time.monotonic()
    c = classify_exit(ExitEvidence("w", 1, log_tail=tail.lines()), rules)
    # RE2 takes well under a second; Python's re would take longer than the universe
    assert time.monotonic() - t0 < 5
    assert c.failure_class is FailureClass.USER_ERROR


def test_patterns_are_case_insensitive_and_still_regexes() -> None:
    p = compile_user_pattern(r"flaky service \d+")
    assert p.search("ERROR: Flaky Service 42 went away") is not None
    assert p.search("flaky service x") is None


def test_what_re2_cannot_parse_is_a_plain_keyword() -> None:
    backref = compile_user_pattern(r"(a)\1")
    assert backref.search(r"log: (a)\1 here") is not None and backref.search("aa") is None
    bracket = compile_user_pattern("quota [exceeded")
    assert bracket.search("Quota [Exceeded for bucket") is not None


def test_a_user_keyword_makes_its_line_retryable() -> None:
    rules = Rules.default(("my flaky service \\d+",))
    tail = ("Traceback (most recent call last):", "RuntimeError: my flaky service 3 is down")
    c = classify_exit(ExitEvidence("w", 1, log_tail=tail), rules)
    assert (c.retryable, c.rule) == (True, "spec-keyword-0")
