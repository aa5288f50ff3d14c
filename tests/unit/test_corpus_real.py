"""The classifier on real failure logs from public issue threads (issue 13).

The corpus (tests/corpus_real/, see its README) holds log excerpts as people pasted them,
each with the thread's address and a label from what the thread concluded. The test part
(~30% of threads, by a hash of the address) was not read while the rules were written:
its numbers are the ones that count. The floors are the measured numbers less a margin,
so that a change that makes the judgement worse fails here.
"""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from corpus_baselines import EXPERT
from corpus_real_eval import (
    POLICIES,
    PROGRESSED,
    Case,
    evaluate,
    load,
    outcome,
    score,
)

from trainguard.classify.classes import Classification

# Measured (tests/support/corpus_real_eval.py --test) on 1420 cases, accuracy / wasted / missed,
# with the thread's `progressed` (issue 38): the rules with the learned model: dev
# (cross-validated) 77.5% / 20.3% / 25.8%, test 70.5% / 21.6% / 40.7%; the rules alone
# (--rules): dev 72.6% / 31.1% / 21.7%, test 65.1% / 33.2% / 37.3%. The floors are those
# less about 3 points. The issue 13 targets (test accuracy >= 0.90, wasted and missed <=
# 10%) are not met.
FLOORS = {
    "dev": {"accuracy": 0.75, "wasted": 0.23, "missed": 0.28},
    "test": {"accuracy": 0.67, "wasted": 0.24, "missed": 0.44},
}
RULES_FLOORS = {
    "dev": {"accuracy": 0.69, "wasted": 0.34, "missed": 0.25},
    "test": {"accuracy": 0.62, "wasted": 0.36, "missed": 0.41},
}


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return load()


Parts = dict[str, list[tuple[Case, Classification]]]


_evaluated: list[Parts] = []
EVALUATION_TIMEOUT_S = 1200


def _parts(cases: list[Case]) -> Parts:
    """Evaluated once, inside a test (which no_cover keeps out of coverage tracing: a model
    trained per fold took 20 s, 44-49 s on 2026-12-06 with this machine idle). Whichever
    test comes first evaluates, under `EVALUATION_TIMEOUT_S`: under the suite's load it
    once passed the default 300 s, and each test after it started over and timed out too."""
    if not _evaluated:
        _evaluated.append(evaluate(cases))
    return _evaluated[0]


@pytest.fixture(scope="module")
def rules_parts(cases: list[Case]) -> Parts:
    return evaluate(cases, rules_only=True)


def test_the_corpus_is_real_large_varied_and_split_once(cases: list[Case]) -> None:
    assert len(cases) >= 300
    assert len({c.id for c in cases}) == len(cases)
    assert len({c.url for c in cases}) >= 0.95 * len(cases)  # one case per thread, nearly
    assert sum(c.retryable for c in cases) >= 0.40 * len(cases)
    assert len({c.category for c in cases}) >= 15
    assert all(c.log and len(c.log) <= 45 and len("\n".join(c.log)) <= 3300 for c in cases)
    test_share = sum(c.split == "test" for c in cases) / len(cases)
    assert 0.22 <= test_share <= 0.38, test_share
    # threads never straddle the split
    splits = {c.url: c.split for c in cases}
    assert all(splits[c.url] == c.split for c in cases)


@pytest.mark.no_cover
@pytest.mark.timeout(EVALUATION_TIMEOUT_S)
@pytest.mark.parametrize("part", ["dev", "test"])
def test_retry_decisions_on_real_logs(cases: list[Case], part: str) -> None:
    parts = _parts(cases)
    s = score(parts[part])
    print("\n" + s.line(part))
    if part == "dev":  # the test part stays a number: nothing to tune against
        wrong = Counter(
            (k.category, "wasted" if c.retryable else "missed")
            for k, c in parts[part]
            if k.retryable != c.retryable
        )
        print(f"  misses by category: {dict(sorted(wrong.items()))}")
    floor = FLOORS[part]
    assert s.accuracy >= floor["accuracy"]
    assert s.wasted <= floor["wasted"]
    assert s.missed <= floor["missed"]


# The default policy's first decisions as job outcomes (issue 38), measured
# (tests/support/corpus_real_eval.py --test): false stops / permanent failures retried, dev 5.6% /
# 62.0%, test 7.3% / 65.2% (before issue 38: 7.7% / 59.0% and 9.0% / 63.2%). The issue's
# targets (test: <= 5% / <= 30%) are not met: see the README's judgement section.
OUTCOME_FLOORS = {
    "dev": {"false_stops": 0.07, "permanent_retried": 0.66},
    "test": {"false_stops": 0.09, "permanent_retried": 0.69},
}


@pytest.mark.no_cover
@pytest.mark.timeout(EVALUATION_TIMEOUT_S)
@pytest.mark.parametrize("part", ["dev", "test"])
def test_the_default_policy_ends_few_recoverable_jobs(cases: list[Case], part: str) -> None:
    """Scored as what the first decision costs: a retryable failure ended with no retry,
    or a permanent one given a retry (one attempt: the history rule ends the second)."""
    judged = _parts(cases)[part]
    for name, ft in POLICIES.items():
        print("\n" + outcome(judged, ft).line(f"{part}, {name}"))
    o = outcome(judged, POLICIES["the default policy"])
    floor = OUTCOME_FLOORS[part]
    assert o.false_stops <= floor["false_stops"]
    assert o.permanent_retried <= floor["permanent_retried"]
    old = outcome(judged, POLICIES["--retry-uncertain false"])
    assert o.false_stops < old.false_stops / 3  # what the default buys
    assert old.false_stops == score(judged).missed  # the two scores agree where they meet


def test_progressed_answers_name_each_case_once(cases: list[Case]) -> None:
    """progressed.yaml holds one answer per case, true, false or null, with its reason."""
    entries = yaml.safe_load(PROGRESSED.read_text())
    ids = [str(e["id"]) for e in entries]
    assert sorted(ids) == sorted(c.id for c in cases)
    for e in entries:
        assert e["progressed"] in (True, False, None), e["id"]
        assert bool(e["because"]) == (e["progressed"] is not None), e["id"]
    told = sum(c.progressed is not None for c in cases)
    assert told >= 0.5 * len(cases)


@pytest.mark.parametrize("part", ["dev", "test"])
def test_the_rules_alone_hold_their_own_floor(rules_parts: Parts, part: str) -> None:
    """The model seconds the rules; it must not become the reason they can decay."""
    s = score(rules_parts[part])
    print("\n" + s.line(part + " (rules alone)"))
    floor = RULES_FLOORS[part]
    assert s.accuracy >= floor["accuracy"]
    assert s.wasted <= floor["wasted"]
    assert s.missed <= floor["missed"]


def test_the_expert_answers_name_concluded_cases_of_the_corpus(cases: list[Case]) -> None:
    """The log-only expert's answers (--expert) cover concluded cases, once each."""
    answers = yaml.safe_load(EXPERT.read_text())
    by_id = {c.id: c for c in cases}
    ids = [str(a["id"]) for a in answers]
    assert len(ids) == len(set(ids)) >= 400
    for a in answers:
        case = by_id[str(a["id"])]
        assert not case.doubtful, case.id
        assert isinstance(a["retryable"], bool) and isinstance(a["sure"], bool), case.id
        assert case.split == "dev" or "why" not in a, (
            f"{case.id}: a test case's reasons are kept out"
        )
