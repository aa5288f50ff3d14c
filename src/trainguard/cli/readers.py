"""The commands that read a job (from the store, or a server through the same `Reader`)
and print it: jobs, status, records, explain, stacks, goodput, logs, classify."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainguard.classify.classes import Classification
from trainguard.classify.logtail import printable
from trainguard.cli.render import (
    console,
    fmt_time,
    jobs_table,
    records_renderable,
    status_renderable,
    to_text,
)
from trainguard.errors import SpecError
from trainguard.records.explain import (
    classification_json,
    classify_file,
    print_aggregate,
    print_classification,
    print_explain,
)
from trainguard.records.queries import Reader
from trainguard.states import JobState

if TYPE_CHECKING:
    pass


def dump_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def cmd_jobs(args: argparse.Namespace, reader: Reader) -> int:
    rows = reader.jobs(args.limit)
    if args.json:
        dump_json(rows)
        return 0
    if not rows:
        print("no jobs yet")
        return 0
    console().print(jobs_table(rows))
    return 0


def cmd_status(args: argparse.Namespace, reader: Reader) -> int:
    every = getattr(args, "watch", None)
    if every is None:
        view = reader.status(args.job)
        if args.json:
            print(json.dumps(view, indent=2, sort_keys=True))
        else:
            console().print(status_renderable(view))
        return 0
    return watch_status(args.job, reader, every, args.json)


def watch_status(
    job: str,
    reader: Reader,
    every_s: float,
    as_json: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """`status -w`: the status again every `every_s` seconds while it changes, until the
    job ends (or Ctrl-C). On a terminal each one replaces the last; otherwise (a pipe, a
    log) each change is printed below the last, so nothing scrolls by unchanged. --json: one
    JSON object per line per change."""
    tty = sys.stdout.isatty() and not as_json
    last = ""
    try:
        while True:
            view = reader.status(job)
            text = json.dumps(view, sort_keys=True) if as_json else status_text(view, tty)
            if text != last:
                if tty:
                    sys.stdout.write("\x1b[H\x1b[2J")  # home, clear: the new one replaces it
                elif last and not as_json:
                    print()
                print(text, flush=True)
                last = text
            if JobState(view["state"]).is_terminal:
                return 0
            sleep(every_s)
    except KeyboardInterrupt:
        return 0


def status_text(view: dict[str, Any], color: bool = False) -> str:
    return to_text(status_renderable(view), color)


def cmd_explain(args: argparse.Namespace, reader: Reader) -> int:
    data = reader.explain(args.job)
    if args.json:
        dump_json(data)
    else:
        print_explain(data["job"], data["failures"], data.get("decisions", ()))
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    from trainguard.spec.limits import pattern_problems

    problems = pattern_problems(args.retryable_error, "--retryable-error")
    if problems:
        raise SpecError(problems)
    code = None if args.exit_code is None else str(args.exit_code)
    progressed = {None: None, "yes": True, "no": False}[args.progressed]
    c = classify_file(args.log, code, args.signal, args.retryable_error, progressed)
    verdict = first_failure_verdict(c)
    if args.json:
        dump_json(classification_json(c) | verdict)
        return 0
    print_classification(c, False)
    if verdict["decision"] is not None:
        said = "yes" if verdict["retry"] else "no"
        line = f"{said} (the default policy, as a first failure: {verdict['decision']}: "
        print(printable(f"{'retry':<14} {line}{verdict['why']})"))
    return 0


def first_failure_verdict(c: Classification) -> dict[str, Any]:
    """`retry`, `decision` (its kind) and `why`: what the default policy does with `c` as a
    job's first failure. The pure policy itself, with the spec's defaults (read from the
    model, never restated here), fresh budgets and one replica, as a live master would."""
    from trainguard.policy.outcome import first_decision, retries  # the policy: not for status

    if not c.is_failure:
        return {"retry": False, "decision": None, "why": f"a {c.kind.value} exit is no failure"}
    d = first_decision(c)
    return {"retry": retries(d), "decision": type(d).__name__, "why": d.reason}


def cmd_goodput(args: argparse.Namespace, reader: Reader) -> int:
    g = reader.goodput(args.job)
    if args.json:
        dump_json(g)
        return 0
    job = g["job"]
    total = g["total_s"] or 1.0
    print(
        f"job {job['id']} ({job['state']}): {g['total_s']:.1f} s in all, {g['failures']} failure(s)"
    )
    print(f"  productive   {g['productive_s']:8.2f} s  {100 * g['goodput']:5.1f}%")
    for key, value in g["badput"].items():
        print(f"  {key[:-2].replace('_', ' '):<12} {value:8.2f} s  {100 * value / total:5.1f}%")
    print(f"advice: {g['advice']['text']}")
    if not g["has_progress"]:
        print(
            "(no progress seen: the first rank's output showed no step trainguard can read; "
            "give --progress-pattern, or call sdk.report)"
        )
    return 0


def cmd_stacks(args: argparse.Namespace, reader: Reader) -> int:
    from trainguard.hangs.stack_model import StackReport
    from trainguard.hangs.stacks import render

    views = reader.stacks(args.job, args.attempt)
    if args.json:
        dump_json(views)
        return 0
    if not views:
        where = f" in attempt {args.attempt}" if args.attempt is not None else ""
        print(f"job {args.job} has no stack dumps{where} (they are taken when it hangs)")
        return 0
    for v in views:
        print(
            f"== attempt {v['attempt']}, {v['kind'].replace('_', ' ')} at "
            f"{fmt_time(v['at_s'])} (stacks taken in {v['duration_ms']:.0f} ms)"
        )
        print(render(StackReport.from_dict(v["report"])))
    return 0


def cmd_records(args: argparse.Namespace, reader: Reader) -> int:
    rows = reader.records(args.job, args.aggregate)
    if args.aggregate:
        if args.json:
            dump_json(rows)
        else:
            print_aggregate(rows)
        return 0
    if args.json:
        dump_json(rows)
        return 0
    if not rows:
        print(f"job {args.job} has no restart records ({reader.status(args.job)['state']})")
        return 0
    console().print(records_renderable(rows))
    return 0


def cmd_logs(args: argparse.Namespace, reader: Reader) -> int:
    log = reader.log(args.job, args.replica, args.attempt, args.tail)
    if not log["exists"]:
        print(f"(no output yet: {log['path']})", file=sys.stderr)
        return 0
    sys.stdout.write(log["text"])
    return 0
