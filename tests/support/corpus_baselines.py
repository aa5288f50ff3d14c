"""What a reader of the log alone scores on the real corpus (tests/corpus_real/), to set
the classifier's numbers against: answering by the case's category (its majority label on
the development part), and an on-call expert's answers (tests/corpus_real/expert/).
`corpus_real_eval.py --ceiling` and `--expert` print them.
"""

from __future__ import annotations

from collections import Counter

import yaml
from corpus_real_eval import CORPUS, Case, Score, score

from trainguard.classify.classes import Classification, ExitKind


def answered(retry: bool, by: str) -> Classification:
    """A bare retry decision that someone or something other than the classifier gave."""
    return Classification(ExitKind.NONZERO, None, retry, by, 1, None, "", "")


def by_category(cases: list[Case]) -> dict[str, bool]:
    """Each category's majority label on the development part: what an expert who filed
    the log's family exactly, and knew nothing else, would best answer."""
    votes: dict[str, Counter[bool]] = {}
    for c in cases:
        if c.split == "dev":
            votes.setdefault(c.category, Counter())[c.retryable] += 1
    return {k: v[True] > v[False] for k, v in votes.items()}


def ceiling(cases: list[Case]) -> dict[str, Score]:
    """The score of answering each case by its category's majority label, per part.

    The category is what an expert reading only the log files it under; within one, the
    label often turns on what only the thread knew (it recurred, a rerun worked).
    """
    majority = by_category(cases)
    parts: dict[str, list[tuple[Case, Classification]]] = {"dev": [], "test": []}
    for case in cases:
        retry = majority.get(case.category, False)
        parts[case.split].append((case, answered(retry, "category")))
    return {name: score(results) for name, results in parts.items()}


EXPERT = CORPUS / "expert" / "answers.yaml"


def expert(
    parts: dict[str, list[tuple[Case, Classification]]],
) -> dict[str, tuple[Score, Score, Score, Score]]:
    """Per part: an expert reading only the log and exit code (tests/corpus_real/expert/),
    the classifier's judgements (`parts`, from `evaluate`) on the same cases, and the
    expert's sure and unsure answers apart."""
    answers = {str(a["id"]): a for a in yaml.safe_load(EXPERT.read_text())}
    out: dict[str, tuple[Score, Score, Score, Score]] = {}
    for name, judged in parts.items():
        ours = [(k, c) for k, c in judged if k.id in answers]
        said = [(k, answered(bool(answers[k.id]["retryable"]), "expert")) for k, _ in ours]
        out[name] = (
            score(said),
            score(ours),
            score([(k, c) for k, c in said if answers[k.id]["sure"]]),
            score([(k, c) for k, c in said if not answers[k.id]["sure"]]),
        )
    return out


def print_expert(
    parts: dict[str, list[tuple[Case, Classification]]], names: tuple[str, ...]
) -> None:
    scores = expert(parts)
    for name in names:
        said, ours, sure, unsure = scores[name]
        print(said.line(f"{name}, an expert reading only the log"))
        print(ours.line(f"{name}, the classifier on the same cases"))
        print(sure.line(f"{name}, the expert's sure answers"))
        print(unsure.line(f"{name}, the expert's unsure answers"))
