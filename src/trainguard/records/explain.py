"""Why did trainguard do that? (R-CLS-4, R-REC-1): `explain`, `records --aggregate`, `classify`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainguard.classify.classes import UNCERTAIN_BELOW, Classification, ExitEvidence
from trainguard.classify.logtail import TAIL_BYTES, Tail, printable
from trainguard.classify.readings import from_json
from trainguard.errors import SpecError
from trainguard.records.rows import FailureRow
from trainguard.records.schema import DECISION_EVENT, HANG_CLEARED_EVENT, WARM_START_EVENT
from trainguard.signals import parse_signal
from trainguard.spec.bounded_read import read_tail

EXPLAINED_EVENTS = {
    DECISION_EVENT: "decision",
    HANG_CLEARED_EVENT: "not a hang",
    WARM_START_EVENT: "start",
}
"""Events `explain` lists beside the failures, with their label: decisions no failure led
to, hangs that turned out not to be (a sign of life arrived while the stacks were taken),
and how the replicas started (warm from the zygote, or cold and why)."""


def aggregate(failures: Sequence[FailureRow]) -> list[dict[str, Any]]:
    """Failures grouped by fingerprint: how often, on which replicas, first and last seen."""
    groups: dict[str, dict[str, Any]] = {}
    for f in failures:
        key = f.fingerprint or f"{f.failure_class}:{f.rule}"
        g = groups.setdefault(
            key,
            {
                "fingerprint": key,
                "failure_class": f.failure_class,
                "rule": f.rule,
                "example": f.matched_line or f.message,
                "count": 0,
                "root_causes": 0,
                "replicas": [],
                "first_at_s": f.at_s,
                "last_at_s": f.at_s,
            },
        )
        g["count"] += 1
        g["root_causes"] += 1 if f.root_cause else 0
        if f.replica not in g["replicas"]:
            g["replicas"].append(f.replica)
        g["last_at_s"] = max(g["last_at_s"], f.at_s)
    return sorted(groups.values(), key=lambda g: (-g["count"], g["first_at_s"]))


def _show(lines: Sequence[str]) -> None:
    """Lines quoting job data (replica output, messages) on stdout: seen, never obeyed."""
    print(printable("\n".join(lines)))


def print_aggregate(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no failures recorded")
        return
    out: list[str] = []
    for g in rows:
        out.append(
            f"{g['count']:>4}x  {g['failure_class']:<22} rule {g['rule']:<22} "
            f"fingerprint {g['fingerprint']}  replicas {', '.join(sorted(g['replicas']))}"
        )
        out.append(f"       {g['example']}")
    _show(out)


def print_explain(
    job: dict[str, Any], failures: list[dict[str, Any]], decisions: Sequence[dict[str, Any]] = ()
) -> None:
    out = [f"job {job['id']} ({job['name']}): {job['state']}, {job['attempts']} attempt(s)"]
    if not failures:
        out.append("no failures: nothing needed explaining")
    for f in failures:
        role = "root cause" if f["root_cause"] else f"cascade of {f['cascade_of']}"
        retry = "retryable" if f["retryable"] else "not retryable"
        out.append(f"- attempt {f['attempt']}, {f['replica']} ({role})")
        out.append(f"    class        {f['failure_class']} ({retry})")
        out.append(f"    rule         {f['rule']}")
        if f["matched_line"]:
            out.append(f"    matched line {f['matched_line']}")
        if f.get("confidence") is not None:
            sure = " (uncertain)" if f["confidence"] < UNCERTAIN_BELOW else ""
            out.append(
                f"    confidence   {f['confidence']:.2f}{sure}, phase {f['phase'] or 'unknown'}"
            )
        if f.get("step") is not None:
            out.append(f"    at step      {f['step']}")
        for note in (f.get("notes") or "").splitlines():
            out.append(f"    context      {note}")
        for reading in from_json(f.get("machine")):  # source: value -> reading (sure)
            out.append(f"    machine      {reading.shown()}")
        out.append(f"    fingerprint  {f['fingerprint']}")
        out.append(f"    message      {f['message']}")
        out.append(f"    decision     {f['decision']}")
    for d in decisions:
        what = EXPLAINED_EVENTS.get(d["kind"], d["kind"])
        out.append(f"- {what:<12} {d['text']}")
    if job["error_message"]:
        out.append(f"final error: [{job['error_code']}] {job['error_message']}")
    _show(out)


# ---------------------------------------------------------------- offline classification


def _returncode(exit_code: str | None, sig: str | None) -> int:
    if sig is not None:
        try:
            return -parse_signal(sig)
        except ValueError as exc:
            raise SpecError([f"--signal: {exc}"]) from None
    if exit_code is None:
        return 1
    try:
        return int(exit_code)
    except ValueError:
        raise SpecError([f"--exit-code: must be an integer, got {exit_code!r}"]) from None


def classify_file(
    path: Path,
    exit_code: str | None,
    sig: str | None,
    keywords: Sequence[str] = (),
    progressed: bool | None = None,
) -> Classification:
    """The classifier, as the master runs it, over the tail of any log file; `progressed`
    is what a live master knows and a pasted log may hide (it trained before it failed)."""
    from trainguard.classify.catalogue import Rules  # the rules: for `classify`, not `status`
    from trainguard.classify.exits import classify_exit

    try:
        data = read_tail(path, TAIL_BYTES)  # bounded: a device, a FIFO, a huge file
    except OSError as exc:
        raise SpecError([f"{path}: cannot read the log ({exc.strerror})"]) from None
    tail = Tail()  # the bounds of the master's own tail of a replica's output
    for line in data.decode("utf-8", "replace").splitlines():
        tail.append(line)
    code = _returncode(exit_code, sig)
    ev = ExitEvidence("replica", code, log_tail=tail.lines(), progressed=progressed)
    return classify_exit(ev, Rules.default(tuple(keywords)))


def classification_json(c: Classification) -> dict[str, Any]:
    return {
        "kind": c.kind.value,
        "failure_class": c.failure_class.value if c.failure_class else None,
        "retryable": c.retryable,
        "rule": c.rule,
        "matched_line": c.matched_line,
        "fingerprint": c.fingerprint,
        "exit_code": c.exit_code,
        "signal": c.signal,
        "reason": c.reason,
        "message": c.message,
        "cascade": c.cascade,
        "hardware": c.hardware,
        "confidence": c.confidence,
        "uncertain": c.uncertain,
        "phase": c.phase,
        "notes": list(c.notes),
    }


def print_classification(c: Classification, as_json: bool) -> None:
    data = classification_json(c)
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    keys = ("failure_class", "retryable", "rule", "matched_line", "fingerprint", "message")
    out = [f"{key:<14} {data[key]}" for key in keys]
    sure = ""
    if c.uncertain:
        sure = " (uncertain: retried at most once)" if c.retryable else " (uncertain)"
    out.append(f"{'confidence':<14} {c.confidence:.2f}{sure}")
    out.append(f"{'phase':<14} {c.phase}")
    out += [f"{'context':<14} {note}" for note in c.notes]
    _show(out)
