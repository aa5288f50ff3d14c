"""Would a small text model beat the rules? TF-IDF nearest neighbours on the real corpus.

Scored on the development part of tests/corpus_real/ only, leave one thread out: each
case is judged by its nearest neighbours among the other threads' cases, and the model
overrides the rules only where the rules are less sure than a gate and the neighbours
agree. Prints the rules alone and each setting; the test part is never read.

    .venv/bin/python bench/corpus_knn.py
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from itertools import pairwise
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from corpus_real_eval import Case, by_rules, load

from trainguard.classify.fingerprint import normalise
from trainguard.classify.logtail import clean

_WORD = re.compile(r"[A-Za-z_]{3,}")


def _bag(case: Case) -> Counter[str]:
    words = [w for line in case.log for w in _WORD.findall(normalise(clean(line)).lower())]
    return Counter(words) + Counter(f"{a}_{b}" for a, b in pairwise(words))


def _vector(bag: Counter[str], idf: dict[str, float], default: float) -> dict[str, float]:
    v = {t: (1 + math.log(c)) * idf.get(t, default) for t, c in bag.items()}
    norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
    return {t: x / norm for t, x in v.items()}


def neighbours(cases: list[Case], k: int) -> dict[str, list[tuple[float, bool]]]:
    """For each case: (similarity, label) of its k nearest cases from other threads."""
    bags = {c.id: _bag(c) for c in cases}
    out: dict[str, list[tuple[float, bool]]] = {}
    for case in cases:
        train = [c for c in cases if c.url != case.url]
        df: Counter[str] = Counter()
        for c in train:
            df.update(set(bags[c.id]))
        idf = {t: math.log((len(train) + 1) / (n + 1)) + 1 for t, n in df.items()}
        default = math.log(len(train) + 1) + 1
        q = _vector(bags[case.id], idf, default)
        sims = []
        for c in train:
            v = _vector(bags[c.id], idf, default)
            sims.append((sum(q.get(t, 0.0) * x for t, x in v.items()), c.retryable))
        out[case.id] = sorted(sims, reverse=True)[:k]
    return out


def main() -> None:
    cases = [c for c in load() if c.split == "dev"]
    rules = {c.id: by_rules(c) for c in cases}
    near = neighbours(cases, 7)
    permanent = sum(not c.retryable for c in cases)

    def score(k: int, gate: float, agree: float) -> tuple[float, float, float, int]:
        right = wasted = missed = used = 0
        for c in cases:
            decision = rules[c.id].retryable
            top = near[c.id][:k]
            total = sum(s for s, _ in top) or 1.0
            p = sum(s for s, label in top if label) / total
            if rules[c.id].confidence < gate and (p >= agree or p <= 1 - agree):
                decision, used = p >= 0.5, used + 1
            right += decision == c.retryable
            wasted += decision and not c.retryable
            missed += c.retryable and not decision
        retryable = len(cases) - permanent
        return right / len(cases), wasted / permanent, missed / retryable, used

    print(f"development part: {len(cases)} cases, leave one thread out")
    acc, wasted, missed, _ = score(1, 0.0, 2.0)
    print(f"rules alone: accuracy {acc:.1%}, wasted {wasted:.1%}, missed {missed:.1%}")
    for k in (3, 5, 7):
        for gate in (0.6, 0.8, 0.95):
            for agree in (0.7, 0.8):
                acc, wasted, missed, used = score(k, gate, agree)
                print(
                    f"k={k} gate={gate} agree={agree}: accuracy {acc:.1%}, wasted "
                    f"{wasted:.1%}, missed {missed:.1%} ({used} decisions changed)"
                )


if __name__ == "__main__":
    main()
