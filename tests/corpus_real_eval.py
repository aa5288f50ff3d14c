"""The classifier against real failure logs from public issue threads (tests/corpus_real/).

Each case is a log excerpt as someone pasted it, with the thread's address and a label
taken from what the thread concluded (../shared/LABELS.md). The split into a development
part (~70%) and a test part (~30%) is fixed by a hash of the thread's address, so it was
decided before any rule was written and cases of one thread never straddle it. Rules are
tuned by reading development cases only:

    .venv/bin/python tests/corpus_real_eval.py            # the development part's numbers
    .venv/bin/python tests/corpus_real_eval.py --wrong    # ... and its misses
    .venv/bin/python tests/corpus_real_eval.py --test     # the test part's numbers too

The test part's cases are never printed by this script, and its numbers only on request.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainguard.policy.classes import Classification, ExitEvidence
from trainguard.policy.classify import classify_exit

CORPUS = Path(__file__).parent / "corpus_real"
TEST_SHARE = 30  # percent of threads in the test part
CONFIDENT = 0.7  # a decision at this confidence or more is one the classifier is sure of
FIELDS = frozenset({"id", "url", "exit_code", "category", "retryable", "note", "log"})
CATEGORIES = frozenset(
    {
        "collective_timeout",
        "collective_error",
        "network",
        "rendezvous",
        "gpu_hardware",
        "cuda_error",
        "device_oom",
        "host_oom",
        "segfault",
        "abort",
        "preemption",
        "node_lost",
        "storage",
        "remote_service",
        "capacity",
        "code_bug",
        "config",
        "data",
        "dependency",
    }
)
_QUOTE = re.compile(r"^> ?")


@dataclass(frozen=True)
class Case:
    id: str
    url: str
    exit_code: int | None
    category: str
    retryable: bool
    note: str
    log: tuple[str, ...]

    @property
    def split(self) -> str:
        """'test' for ~30% of threads, by a hash of the address; 'dev' for the rest."""
        digest = hashlib.sha256(self.url.encode()).digest()
        return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_SHARE else "dev"

    @property
    def doubtful(self) -> bool:
        return "doubtful" in self.note.lower()


def _log_lines(text: str) -> tuple[str, ...]:
    """The pasted lines; a Markdown quote ("> ") around the whole paste is not the log's."""
    lines = text.rstrip("\n").splitlines()
    body = [x for x in lines if x.strip()]
    if body and all(_QUOTE.match(x) for x in body):
        lines = [_QUOTE.sub("", x) for x in lines]
    return tuple(lines)


def load(corpus: Path = CORPUS) -> list[Case]:
    """Every case of every `*.yaml` file under `corpus/cases`, checked field by field."""
    out: list[Case] = []
    for path in sorted((corpus / "cases").glob("*.yaml")):
        for i, e in enumerate(yaml.safe_load(path.read_text()) or []):
            where = f"{path.name}[{i}]"
            if not isinstance(e, dict) or set(e) != FIELDS:
                raise ValueError(f"{where}: fields must be {sorted(FIELDS)}")
            if e["category"] not in CATEGORIES:
                raise ValueError(f"{where}: unknown category {e['category']!r}")
            if not str(e["url"]).startswith("https://github.com/"):
                raise ValueError(f"{where}: url must be a GitHub thread, got {e['url']!r}")
            code = e["exit_code"]
            out.append(
                Case(
                    id=str(e["id"]),
                    url=str(e["url"]),
                    exit_code=None if code is None else int(code),
                    category=str(e["category"]),
                    retryable=bool(e["retryable"]),
                    note=str(e["note"]),
                    log=_log_lines(str(e["log"])),
                )
            )
    return out


def classify_case(case: Case) -> Classification:
    """The classifier as the master runs it: the exit status and the log tail.

    A log that shows no exit status is taken as a launcher's exit 1 (what torchrun,
    DeepSpeed's and Accelerate's launchers and a Python traceback all end in).
    """
    code = 1 if case.exit_code is None else case.exit_code
    c = classify_exit(ExitEvidence("worker-0", code, log_tail=case.log))
    assert c.failure_class is not None
    return c


@dataclass(frozen=True)
class Score:
    cases: int
    retryable: int
    accuracy: float  # retry decisions right
    wasted: float  # of the permanent failures, called retryable
    missed: float  # of the retryable failures, called permanent
    uncertain: int
    wasted_sure: float  # of the permanent failures, called retryable and not uncertain
    confident: int = 0  # decisions made with confidence >= CONFIDENT
    confident_wrong: int = 0

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.cases} cases ({self.retryable} retryable); accuracy "
            f"{self.accuracy:.1%}, wasted retries {self.wasted:.1%} "
            f"({self.wasted_sure:.1%} beyond one uncertain retry), missed retries "
            f"{self.missed:.1%}; {self.uncertain} uncertain; of the {self.confident} decided "
            f"with confidence >= {CONFIDENT:g}, {self.confident_wrong} wrong"
        )


def score(results: list[tuple[Case, Classification]]) -> Score:
    permanent = [(k, c) for k, c in results if not k.retryable]
    retryable = [(k, c) for k, c in results if k.retryable]
    right = sum(k.retryable == c.retryable for k, c in results)
    return Score(
        cases=len(results),
        retryable=len(retryable),
        accuracy=right / max(1, len(results)),
        wasted=sum(c.retryable for _, c in permanent) / max(1, len(permanent)),
        missed=sum(not c.retryable for _, c in retryable) / max(1, len(retryable)),
        uncertain=sum(c.uncertain for _, c in results),
        wasted_sure=sum(c.retryable and not c.uncertain for _, c in permanent)
        / max(1, len(permanent)),
        confident=sum(c.confidence >= CONFIDENT for _, c in results),
        confident_wrong=sum(
            c.confidence >= CONFIDENT and k.retryable != c.retryable for k, c in results
        ),
    )


def evaluate(cases: list[Case]) -> dict[str, list[tuple[Case, Classification]]]:
    parts: dict[str, list[tuple[Case, Classification]]] = {"dev": [], "test": []}
    for case in cases:
        parts[case.split].append((case, classify_case(case)))
    return parts


def main() -> None:
    p = argparse.ArgumentParser(description="score the classifier on the real corpus")
    p.add_argument("--wrong", action="store_true", help="list the development part's misses")
    p.add_argument("--category", help="only this category's misses")
    p.add_argument("--test", action="store_true", help="also score the test part")
    args = p.parse_args()
    cases = load()
    parts = evaluate(cases)
    print(f"{len(cases)} cases, {sum(c.retryable for c in cases)} retryable")
    for name in ("dev", "test") if args.test else ("dev",):
        print(score(parts[name]).line(name))
    print("dev by category:", dict(Counter(k.category for k, _ in parts["dev"])))
    if args.wrong:
        for case, c in parts["dev"]:
            if case.retryable == c.retryable:
                continue
            if args.category and case.category != args.category:
                continue
            print(
                f"\n== {case.id} {case.category} labelled retryable={case.retryable} got "
                f"{c.failure_class} rule {c.rule} conf {c.confidence} ({case.url})\n"
                f"   note: {case.note}\n   line: {c.matched_line}"
            )
            for line in case.log[-25:]:
                print(f"   | {line[:200]}")


if __name__ == "__main__":
    main()
