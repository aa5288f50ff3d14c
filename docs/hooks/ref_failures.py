"""The failure catalogue: every signature of `classify/signatures.yaml`, with what the
default policy does with a failure it explains (`policy.outcome`, as `trainguard classify`
says it), so "retried" here is the master's decision, not a second copy of its rules."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from refmd import code, prose, table

from trainguard.classify.catalogue import Signature, builtin_catalogue, first_match
from trainguard.classify.classes import Classification, ExitKind, FailureClass
from trainguard.classify.logtail import clean
from trainguard.policy import outcome


def _classification(sig: Signature, untrained: bool = False) -> Classification:
    """What the classifier makes of an exit 1 whose tail this signature explains (in
    start-up, its `untrained` reading where it has one)."""
    u = sig.untrained if untrained else None
    return Classification(
        kind=ExitKind.NONZERO,
        failure_class=FailureClass(u.failure_class if u else sig.failure_class),
        retryable=u.retryable if u else sig.retryable,
        rule=f"{sig.id}-untrained" if u else sig.id,
        exit_code=1,
        signal=None,
        reason=u.reason if u else sig.reason,
        message=u.reason if u else sig.reason,
        cascade=sig.cascade,
        hardware=sig.hardware,
        confidence=u.confidence if u else sig.confidence,
    )


def decision(sig: Signature, untrained: bool = False) -> str:
    """What the default policy does with it as a job's first failure: `retried` or
    `ends the job`, and `(uncertain)` where the evidence is."""
    c = _classification(sig, untrained)
    retried = outcome.retries(outcome.first_decision(c))
    said = "retried" if retried else "ends the job"
    return f"{said} (uncertain)" if c.uncertain else said


def alternatives(pattern: str) -> list[str]:
    """A regex's top-level alternatives (`a|b(c|d)` -> `a`, `b(c|d)`): one a line reads."""
    out, start, depth, in_class, escaped = [], 0, 0, False, False
    for i, ch in enumerate(pattern):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    return [*out, pattern[start:]]


def _pattern(sig: Signature) -> str:
    return sig.pattern.pattern if isinstance(sig.pattern, re.Pattern) else str(sig.pattern)


def _marks(sig: Signature) -> str:
    """The entry's optional flags, as the yaml names them."""
    return ", ".join(
        code(name)
        for name, on in (("cascade", sig.cascade), ("hardware", sig.hardware), ("weak", sig.weak))
        if on
    )


def render_summary(sigs: tuple[Signature, ...]) -> str:
    rows = [
        [
            f"[{code(s.id)}](#{s.id})",
            code(s.failure_class),
            "yes" if s.retryable else "no",
            f"{s.confidence:g}",
            decision(s),
            _marks(s),
        ]
        for s in sigs
    ]
    heads = ["Signature", "Class", "Retryable", "Confidence", "By default", "Marks"]
    return "\n".join(["## Signatures", "", table(heads, rows), ""])


REAL_CASES = Path(__file__).resolve().parents[2] / "tests" / "corpus_real" / "cases"
"""Log excerpts people pasted in public threads, each with its thread's address."""
EXAMPLE_CHARS = 200


def real_examples(sigs: tuple[Signature, ...]) -> dict[str, tuple[str, str]]:
    """Signature id -> the first line of the real corpus it explains, and the thread it
    was pasted in (a line each signature is the first to match, in the cases' order)."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(REAL_CASES.glob("*.yaml")):
        for case in yaml.safe_load(path.read_text()) or []:
            log, url = case.get("log"), case.get("url")
            if not isinstance(log, str) or not isinstance(url, str):
                continue
            for raw in log.splitlines():
                line = clean(raw)
                sig = first_match(sigs, line)
                if sig is not None and sig.id not in out:
                    out[sig.id] = (line, url)
    return out


def render_entry(sig: Signature, example: tuple[str, str] | None = None) -> str:
    parts = [f"### {sig.id} {{ #{sig.id} }}", "", prose(sig.reason), ""]
    facts = [
        f"class {code(sig.failure_class)}",
        "retryable" if sig.retryable else "not retryable",
        f"confidence {sig.confidence:g}",
        decision(sig),
    ]
    if sig.untrained is not None:
        u = sig.untrained
        facts.append(
            f"before any training progress: class {code(u.failure_class)}, "
            f"{'retryable' if u.retryable else 'not retryable'}, confidence {u.confidence:g}, "
            f"{decision(sig, untrained=True)} ({prose(u.reason)})"
        )
    parts += [f"- {fact}" for fact in facts]
    if example is not None:
        line, url = example
        shown = line if len(line) <= EXAMPLE_CHARS else line[: EXAMPLE_CHARS - 3] + "..."
        parts += ["", f"A line it explains, from a log pasted in <{url}>:", ""]
        parts += ["```text", shown, "```"]
    parts += ["", "Pattern, one alternative a line (each line of the log tail is searched):", ""]
    parts += ["```text", *alternatives(_pattern(sig)), "```", ""]
    return "\n".join(parts)


def render() -> str:
    sigs = builtin_catalogue()
    seen = real_examples(sigs)
    entries = (render_entry(s, seen.get(s.id)) for s in sigs)
    return "\n".join([render_summary(sigs), "## Entries", "", *entries])
