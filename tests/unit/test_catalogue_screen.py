"""The RE2 screen in front of the catalogue (`first_match`): it must never change which
signature a line matches, only how fast. Checked on every line of the real-failure corpus
(logs people pasted in public threads: material we did not write) and of our corpus, and
on lines made to sit at the edges of what the two engines agree on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainguard.classify.catalogue import (
    Signature,
    _screen,
    _without_lookarounds,
    builtin_catalogue,
    first_match,
)
from trainguard.classify.logtail import clean

TESTS = Path(__file__).resolve().parents[1]


def _unscreened(sigs: tuple[Signature, ...], line: str, weak: bool | None) -> Signature | None:
    for sig in sigs:
        if (weak is None or sig.weak == weak) and sig.pattern.search(line):
            return sig
    return None


def _corpus_lines() -> list[str]:
    lines: list[str] = []
    for path in sorted((TESTS / "corpus_real").rglob("*.yaml")):
        for case in yaml.safe_load(path.read_text()) or []:
            if isinstance(case, dict) and isinstance(case.get("log"), str):
                lines += case["log"].splitlines()
    for path in sorted((TESTS / "corpus").glob("*.log")):
        lines += path.read_text(errors="replace").splitlines()
    return lines


def test_the_screen_changes_no_match_on_any_corpus_line() -> None:
    """What the screen leaves out of a line's candidates does not match it in Python's
    `re` (so `first_match` finds what it found without the screen)."""
    sigs = builtin_catalogue()
    screen = _screen(sigs)
    lines = [clean(raw) for raw in _corpus_lines()]
    assert len(lines) > 10_000  # the corpora are there
    screened = matched = 0
    for line in lines:
        maybe = screen.candidates(line)
        if maybe is None:
            continue
        screened += 1
        for i, sig in enumerate(sigs):
            if sig.pattern.search(line):
                matched += 1
                assert i in maybe, (sig.id, line)
    assert screened > 0.9 * len(lines) and matched > 1000, (screened, matched)


@pytest.mark.parametrize(
    "line",
    [
        "Preemption notice: the node is being preempted",
        "torch.distributed.elastic: preempt",  # the lookbehind refuses `.preempt`
        "ion sync manager preemption sync manager",
        "NCCL error:\x0bunhandled system error",  # a space only Python's \\s takes
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "RuntimeError: NCCL communicator was aborted on rank 3",
        "ConnectionRefusedError: HTTPConnectionPool(host='localhost', port=8080) refused",
        "Bus error (core dumped)",
        "PCIe Bus error: severity=Corrected",
        "héllo wörld RuntimeError: CUDA error: an illegal memory access",
        "",
    ],
)
def test_the_screen_agrees_at_the_edges(line: str) -> None:
    sigs = builtin_catalogue()
    for weak in (None, False, True):
        assert first_match(sigs, line, weak) is _unscreened(sigs, line, weak)


def test_every_signature_is_screened() -> None:
    """The lookarounds left out, RE2 takes all 54: only the one made of lookarounds alone
    (a local service refused: two conditions on one line) is tried on every line."""
    sigs = builtin_catalogue()
    maybe = _screen(sigs).candidates("a plain progress line: step 12 loss 0.5")
    assert maybe is not None and {sigs[i].id for i in maybe} == {"local-service-down"}


@pytest.mark.parametrize(
    ("pattern", "relaxed"),
    [
        (r"(?<![\w.])preempt(?!ion sync manager)|Spot", "preempt|Spot"),
        (r"^(?=.*(a|b)\b)(?=.*c)x", "^x"),
        (r"a[(?=]b(?!x[)]y)c", "a[(?=]bc"),  # inside a class it is no group
        (r"\(?=x", r"\(?=x"),  # an escaped parenthesis opens none
    ],
)
def test_lookarounds_are_left_out(pattern: str, relaxed: str) -> None:
    assert _without_lookarounds(pattern) == relaxed


def test_a_quantified_lookaround_is_not_relaxed() -> None:
    with pytest.raises(ValueError, match="no superset"):
        _without_lookarounds("a(?=b){2}c")
