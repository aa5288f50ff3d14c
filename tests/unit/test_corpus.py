"""The classifier against hand-written failure log tails (R-CLS-2, R-CLS-3): unit tests.

These tails were written to look real and score far above real logs; the number that
counts is tests/unit/test_corpus_real.py's, on logs from public issue threads. They test the
rules alone: the learned model second-guesses uncertain verdicts from real logs, and three
of these tails (a start-up NCCL timeout, a refused rendezvous, a bare segfault) are ones
it reads as permanent where their writer labelled them retryable.

The corpus (tests/corpus/, see its README) was written apart from the signature
catalogue, from the messages PyTorch, NCCL, CUDA, the kernel and storage clients print.
Two numbers matter: how often the class is right, and how often a permanent failure is
called retryable (a wasted retry). The floors below are set from what was measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import yaml
from conftest import ROOT

from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_by_rules

CORPUS = ROOT / "tests" / "corpus"
MIN_CLASS_ACCURACY = 0.93  # blind first run: 94.2%
MIN_RETRY_ACCURACY = 0.95
MAX_WASTED_RETRY_RATE = 0.05  # of the permanent failures


@dataclass(frozen=True)
class Case:
    file: str
    returncode: int
    label: str
    retryable: bool
    got: str
    got_retryable: bool
    rule: str


def _cases() -> list[Case]:
    manifest = yaml.safe_load((CORPUS / "manifest.yaml").read_text())
    out = []
    for entry in manifest:
        lines = tuple((CORPUS / entry["file"]).read_text(errors="replace").splitlines())
        c = classify_by_rules(ExitEvidence("worker-0", int(entry["returncode"]), log_tail=lines))
        assert c.failure_class is not None
        out.append(
            Case(
                entry["file"],
                int(entry["returncode"]),
                entry["class"],
                bool(entry["retryable"]),
                c.failure_class.value,
                c.retryable,
                c.rule,
            )
        )
    return out


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return _cases()


def test_the_corpus_is_large_and_varied(cases: list[Case]) -> None:
    assert len(cases) >= 60
    assert len({c.label for c in cases}) >= 7


def test_classification_accuracy(cases: list[Case]) -> None:
    wrong = [c for c in cases if c.got != c.label]
    wrong_retry = [c for c in cases if c.got_retryable != c.retryable]
    permanent = [c for c in cases if not c.retryable]
    wasted = [c for c in permanent if c.got_retryable]
    class_acc = 1 - len(wrong) / len(cases)
    retry_acc = 1 - len(wrong_retry) / len(cases)
    wasted_rate = len(wasted) / len(permanent)
    print(
        f"\ncorpus: {len(cases)} cases; class accuracy {class_acc:.1%}; "
        f"retry decision accuracy {retry_acc:.1%}; wasted retries {len(wasted)}/"
        f"{len(permanent)} permanent failures ({wasted_rate:.1%})"
    )
    for c in wrong:
        print(f"  {c.file}: labelled {c.label}, got {c.got} (rule {c.rule})")
    assert class_acc >= MIN_CLASS_ACCURACY
    assert retry_acc >= MIN_RETRY_ACCURACY
    assert wasted_rate <= MAX_WASTED_RETRY_RATE
