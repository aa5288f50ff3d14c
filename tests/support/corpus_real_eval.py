"""The classifier against real failure logs from public issue threads (tests/corpus_real/).

Each case is a log excerpt as someone pasted it, with the thread's address and a label
taken from what the thread concluded (../shared/LABELS.md). The split into a development
part (~70%) and a test part (~30%) is fixed by a hash of the thread's address, so it was
decided before any rule was written and cases of one thread never straddle it. Rules are
tuned by reading development cases only:

    .venv/bin/python tests/support/corpus_real_eval.py          # the development part's numbers
    .venv/bin/python tests/support/corpus_real_eval.py --wrong  # ... and its misses
    .venv/bin/python tests/support/corpus_real_eval.py --test   # the test part's numbers too
    .venv/bin/python tests/support/corpus_real_eval.py --train  # retrain the shipped model
    .venv/bin/python tests/support/corpus_real_eval.py --test --ceiling  # ... and by category alone
    .venv/bin/python tests/support/corpus_real_eval.py --test --expert   # ... and a log-only expert

Each part is scored twice: as readings (accuracy, wasted and missed retries of the
`retryable` verdict) and as job outcomes (issue 38): what the policy's first decision on
the failure costs, for the default policy and for `--retry-uncertain false` (false stops:
retryable failures ended with no retry; permanent failures retried, one attempt each).
Whether the job had trained before it failed (`progressed.yaml`, where the thread tells)
is given to the classifier as the master would give it.

The classifier is the rules plus a learned model (trainguard.classify.learned) trained on
the development part only. Its development number is cross-validated: each case is judged
by a model trained on the other folds' threads, never on its own. The test part is judged
by the shipped model. The test part's cases are never printed by this script, and its
numbers only on request.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainguard.classify import learned
from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.classify.exits import classify_by_rules
from trainguard.policy.outcome import first_decision, retries
from trainguard.spec.models import FaultTolerance

CORPUS = Path(__file__).resolve().parents[1] / "corpus_real"
TEST_SHARE = 30  # percent of threads in the test part
FOLDS = 5  # cross-validation of the development part, by thread
MODEL = Path(__file__).resolve().parents[2] / "src/trainguard/classify" / learned.MODEL_FILE
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
    progressed: bool | None = None  # had it trained before it failed, where the thread tells

    @property
    def split(self) -> str:
        """'test' for ~30% of threads, by a hash of the address; 'dev' for the rest."""
        digest = hashlib.sha256(self.url.encode()).digest()
        return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_SHARE else "dev"

    @property
    def fold(self) -> int:
        digest = hashlib.sha256(f"fold:{self.url}".encode()).digest()
        return int.from_bytes(digest[:4], "big") % FOLDS

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


PROGRESSED = CORPUS / "progressed.yaml"


def progressed_answers(corpus: Path = CORPUS) -> dict[str, bool | None]:
    """id -> had the job trained before it failed (None: neither thread nor log tells)."""
    path = corpus / PROGRESSED.name
    if not path.exists():
        return {}
    out: dict[str, bool | None] = {}
    for e in yaml.safe_load(path.read_text()) or []:
        value = e["progressed"]
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"{path.name}: {e['id']}: progressed must be true, false or null")
        out[str(e["id"])] = value
    return out


def load(corpus: Path = CORPUS) -> list[Case]:
    """Every case of every `*.yaml` file under `corpus/cases`, checked field by field, with
    what `progressed.yaml` says of it."""
    out: list[Case] = []
    progressed = progressed_answers(corpus)
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
                    progressed=progressed.get(str(e["id"])),
                )
            )
    return out


def by_rules(case: Case) -> Classification:
    """The rules as the master runs them: the exit status and the log tail.

    A log that shows no exit status is taken as a launcher's exit 1 (what torchrun,
    DeepSpeed's and Accelerate's launchers and a Python traceback all end in). Whether the
    job had trained is what the master knows (`ExitEvidence.progressed`), here as the
    thread tells it (`progressed.yaml`).
    """
    code = 1 if case.exit_code is None else case.exit_code
    ev = ExitEvidence("worker-0", code, log_tail=case.log, progressed=case.progressed)
    c = classify_by_rules(ev)
    assert c.failure_class is not None
    return c


def example(case: Case) -> learned.Example:
    return learned.Example(
        case.log, by_rules(case), case.retryable, case.id, case.url, case.category
    )


def digest(cases: list[Case]) -> str:
    """What a model was trained on: the development cases, labels and logs."""
    h = hashlib.sha256()
    for c in sorted(cases, key=lambda c: c.id):
        if c.split == "dev":
            h.update(repr((c.id, c.url, c.retryable, c.category, c.log)).encode())
    return h.hexdigest()[:16]


def train(cases: list[Case]) -> learned.Model:
    """The shipped model: trained on every development case, never a test one."""
    dev = [example(c) for c in cases if c.split == "dev"]
    return learned.train(dev, trained_on=digest(cases))


def classify_case(case: Case, model: learned.Model | None = None) -> Classification:
    """The classifier as the master runs it: the rules, then the model where unsure."""
    return learned.reconsider(by_rules(case), case.log, model or learned.default())


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


def evaluate(
    cases: list[Case], rules_only: bool = False
) -> dict[str, list[tuple[Case, Classification]]]:
    """Each part judged: development cases by a model of the other folds, test cases by
    the shipped model (or both by the rules alone)."""
    parts: dict[str, list[tuple[Case, Classification]]] = {"dev": [], "test": []}
    dev = [c for c in cases if c.split == "dev"]
    models: dict[int, learned.Model] = {}
    if not rules_only:
        for f in range(FOLDS):
            models[f] = learned.train([example(c) for c in dev if c.fold != f])
    for case in cases:
        if rules_only:
            c = by_rules(case)
        elif case.split == "dev":
            c = classify_case(case, models[case.fold])
        else:
            c = classify_case(case)
        parts[case.split].append((case, c))
    return parts


@dataclass(frozen=True)
class Outcome:
    """The policy's first decisions scored as what they cost jobs (issue 38)."""

    cases: int
    false_stops: float  # of the retryable failures, ended with no retry
    permanent_retried: float  # of the permanent failures, given a retry (one attempt each)
    accuracy: float  # first decisions right: a retry exactly where it helps

    def line(self, name: str) -> str:
        return (
            f"{name}: {self.cases} cases; false stops {self.false_stops:.1%}, permanent "
            f"failures retried {self.permanent_retried:.1%}, first decisions right "
            f"{self.accuracy:.1%}"
        )


def outcome(results: list[tuple[Case, Classification]], ft: FaultTolerance) -> Outcome:
    """What the policy `ft` does with each case as a job's first failure."""
    said = [(k, retries(first_decision(c, ft))) for k, c in results]
    retryable = [r for k, r in said if k.retryable]
    permanent = [r for k, r in said if not k.retryable]
    return Outcome(
        cases=len(said),
        false_stops=sum(not r for r in retryable) / max(1, len(retryable)),
        permanent_retried=sum(permanent) / max(1, len(permanent)),
        accuracy=sum(r == k.retryable for k, r in said) / max(1, len(said)),
    )


POLICIES = {
    "the default policy": FaultTolerance(),
    "--retry-uncertain false": FaultTolerance(retry_uncertain=False),
}


def print_outcomes(
    parts: dict[str, list[tuple[Case, Classification]]], names: tuple[str, ...]
) -> None:
    for name in names:
        for policy, ft in POLICIES.items():
            print(outcome(parts[name], ft).line(f"{name}, {policy}"))


def main() -> None:
    p = argparse.ArgumentParser(description="score the classifier on the real corpus")
    p.add_argument("--wrong", action="store_true", help="list the development part's misses")
    p.add_argument("--category", help="only this category's misses")
    p.add_argument("--test", action="store_true", help="also score the test part")
    p.add_argument("--rules", action="store_true", help="the rules alone, without the model")
    p.add_argument("--train", action="store_true", help="retrain the shipped model and exit")
    p.add_argument(
        "--ceiling", action="store_true", help="also score answering by the case's category"
    )
    p.add_argument(
        "--expert", action="store_true", help="also score an expert reading only the log"
    )
    p.add_argument(
        "--doubtful",
        action="store_true",
        help="also score the cases whose thread concluded apart from the doubtful ones",
    )
    p.add_argument(
        "--first-contact",
        metavar="PREFIX",
        help="score only the cases whose id starts with PREFIX (a round, e.g. r4) with the "
        "shipped model, both parts, and exit: run on the commit before the round was read",
    )
    args = p.parse_args()
    from corpus_baselines import ceiling, print_expert  # it scores with this module's Score

    cases = load()
    if args.first_contact:
        new = [c for c in cases if c.id.startswith(args.first_contact)]
        print(score([(c, classify_case(c)) for c in new]).line(f"{args.first_contact}*"))
        return
    if args.train:
        MODEL.write_text(json.dumps(learned.to_dict(train(cases)), indent=0) + "\n")
        print(f"wrote {MODEL} ({MODEL.stat().st_size} bytes)")
        return
    parts = evaluate(cases, rules_only=args.rules)
    print(f"{len(cases)} cases, {sum(c.retryable for c in cases)} retryable")
    names = ("dev", "test") if args.test else ("dev",)
    for name in names:
        print(score(parts[name]).line(name + (" (rules alone)" if args.rules else "")))
    print_outcomes(parts, names)
    if args.ceiling:
        by_family = ceiling(cases)
        for name in names:
            print(by_family[name].line(f"{name}, by the category's majority label"))
    if args.expert:
        print_expert(parts, names)
    print_subsets(parts, names, args.doubtful)
    print("dev by category:", dict(Counter(k.category for k, _ in parts["dev"])))
    if args.wrong:
        print_wrong(parts["dev"], args.category)


def print_subsets(
    parts: dict[str, list[tuple[Case, Classification]]], names: tuple[str, ...], doubtful: bool
) -> None:
    """The scores of concluded and doubtful cases apart."""
    for name in names:
        for doubt in (False, True) if doubtful else ():
            part = [(k, c) for k, c in parts[name] if k.doubtful == doubt]
            print(score(part).line(f"{name}, {'doubtful' if doubt else 'concluded'}"))


def print_wrong(dev: list[tuple[Case, Classification]], category: str | None) -> None:
    """The development part's misses, with their logs' last lines."""
    for case, c in dev:
        if case.retryable == c.retryable or (category and case.category != category):
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
