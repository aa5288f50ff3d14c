"""`trainguard`: run a job here, or look at the jobs in the store.

Every user mistake ends in one clear line (or one per problem) and exit status 2;
never in a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard import __version__
from trainguard.errors import JobNotFound, ResumeError, SpecError, TrainguardError
from trainguard.explain import (
    classify_file,
    print_aggregate,
    print_classification,
    print_explain,
)
from trainguard.liveness import reap_interrupted
from trainguard.queries import Reader, StoreReader
from trainguard.spec_flags import add_spec_flags, build_spec, split_command
from trainguard.states import JobState
from trainguard.store import Store, default_home

if TYPE_CHECKING:
    from trainguard.client import Client
    from trainguard.master import Outcome

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _count(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `lo` to `hi`, else one line naming the range."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be from {lo} to {hi}, got {value}")
        return value

    return parse


_MANY = 10**9  # more lines, jobs or attempts than any store holds


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="trainguard", description="Fault-tolerance master for distributed training.")
    p.add_argument("--version", action="version", version=f"trainguard {__version__}")
    p.add_argument("--home", help="state directory (default: $TRAINGUARD_HOME or ./.trainguard)")
    p.add_argument(
        "--db",
        default=os.environ.get("TRAINGUARD_DB"),
        help="store URL, e.g. postgresql+psycopg://user@host/db (default: $TRAINGUARD_DB, "
        "else a SQLite file in the state directory)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    remote = _Parser(add_help=False)
    remote.add_argument(
        "--server",
        default=os.environ.get("TRAINGUARD_SERVER"),
        help="a trainguard server's URL (default: $TRAINGUARD_SERVER; else this machine's store)",
    )
    remote.add_argument(
        "--token-file",
        type=Path,
        help="a file holding the server's token (default: $TRAINGUARD_TOKEN)",
    )
    remote.add_argument(
        "--token", help="the token itself: visible to others in `ps`; prefer --token-file"
    )

    run = sub.add_parser("run", help="run a job and supervise it until it ends")
    add_spec_flags(run)
    run.add_argument("--quiet", action="store_true", help="do not tee replica output")
    run.add_argument(
        "--resume",
        action="store_true",
        help="resume the job of this name if it was interrupted or cancelled, else start it",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

    sb = sub.add_parser("submit", parents=[remote], help="queue a job on a trainguard server")
    add_spec_flags(sb)
    sb.add_argument("--json", action="store_true")
    sb.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

    srv = sub.add_parser("server", help="run the service: queue, HTTP API, web page")
    srv.add_argument("--config", type=Path, help="server settings (YAML)")
    srv.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    srv.add_argument(
        "--port", type=_count(0, 65535), help="port (default 8470; 0 picks a free one)"
    )
    srv.add_argument(
        "--token-file", type=Path, help="require the token in this file (or $TRAINGUARD_TOKEN)"
    )
    srv.add_argument("--token", help="require this token: visible in `ps`; prefer --token-file")
    srv.add_argument(
        "--no-token",
        dest="require_token",
        action="store_false",
        default=None,
        help="serve loopback without a token (default: one made in the home, 0600)",
    )
    srv.add_argument("--cpus", type=float, help="quota: cpus for all running jobs")
    srv.add_argument("--gpus", help="quota: a GPU count, or the ids to hand out (0,1,2,3)")
    srv.add_argument("--memory", help="quota: memory, e.g. 64Gi")

    ms = sub.add_parser("_master")  # started by the server: the master of an admitted job
    ms.add_argument("job")

    res = sub.add_parser(
        "resume", parents=[remote], help="continue an interrupted or cancelled job"
    )
    res.add_argument("job", help="job id or name")
    res.add_argument("--quiet", action="store_true", help="do not tee replica output")

    jobs = sub.add_parser("jobs", parents=[remote], help="list jobs")
    jobs.add_argument("--json", action="store_true")
    jobs.add_argument("--limit", type=_count(1, _MANY), default=50)

    for name, text in (
        ("status", "a job's state, attempts and replicas"),
        ("records", "a job's restart records"),
        ("explain", "why each failure of a job was (or was not) retried"),
        ("cancel", "cancel a running job"),
    ):
        sp = sub.add_parser(name, parents=[remote], help=text)
        sp.add_argument("job", help="job id or name")
        sp.add_argument("--json", action="store_true")
        if name == "records":
            sp.add_argument("--aggregate", action="store_true", help="group faults by error")

    gp = sub.add_parser(
        "goodput", parents=[remote], help="how much of the job's time trained, where the rest went"
    )
    gp.add_argument("job", help="job id or name")
    gp.add_argument("--json", action="store_true")

    st = sub.add_parser(
        "stacks", parents=[remote], help="the stacks taken before a hang was stopped"
    )
    st.add_argument("job", help="job id or name")
    st.add_argument(
        "--attempt", type=_count(0, _MANY), help="the attempt (default: every snapshot)"
    )
    st.add_argument("--json", action="store_true")

    cl = sub.add_parser("classify", help="classify a log file offline, as the master would")
    cl.add_argument("log", type=Path, help="a replica's log file")
    cl.add_argument("--exit-code", help="the exit status (default 1); 139 means SIGSEGV")
    cl.add_argument("--signal", help="or the signal that killed it, e.g. SIGKILL")
    cl.add_argument("--retryable-error", action="append", default=[], help="a job keyword")
    cl.add_argument("--json", action="store_true")

    logs = sub.add_parser("logs", parents=[remote], help="a replica's log")
    logs.add_argument("job", help="job id or name")
    logs.add_argument("--replica", help="replica name, e.g. worker-1 (default: the primary)")
    logs.add_argument("--attempt", type=_count(0, _MANY), help="attempt number (default: the last)")
    logs.add_argument("--tail", type=_count(1, _MANY), help="only the last N lines")
    return p


# ------------------------------------------------------------------ run


def cmd_run(args: argparse.Namespace, store: Store, command: list[str]) -> int:
    from trainguard.control import RESUMABLE
    from trainguard.runner import resume_job, run_job

    spec = build_spec(args, command)
    tee = None if args.quiet else sys.stdout
    if args.resume:
        reap_interrupted(store)
        try:
            job = store.resolve_job(spec.name)
        except JobNotFound:
            job = None
        if job is not None and JobState(job["state"]) in RESUMABLE:
            return _report(*resume_job(job, store, tee=tee))
        if job is not None and not JobState(job["state"]).is_terminal:
            raise ResumeError(f"job {job['id']} ({spec.name}) is {job['state']}: it still runs")
    return _report(*run_job(spec, store, tee=tee))


def cmd_resume(args: argparse.Namespace, store: Store) -> int:
    from trainguard.runner import resume_job

    job = store.resolve_job(args.job)
    return _report(*resume_job(job, store, tee=None if args.quiet else sys.stdout))


def _report(job_id: str, outcome: Outcome) -> int:
    """The end of `run` or `resume`: the outcome in words, and the exit status."""
    state = outcome.state
    err = sys.stderr
    if state is JobState.SUCCEEDED:
        print(
            f"trainguard: job {job_id} SUCCEEDED after {outcome.attempts} attempt(s), "
            f"{outcome.restarts} restart(s). Records: trainguard records {job_id}",
            file=err,
        )
        return 0
    print(f"trainguard: job {job_id} {state.value}", file=err)
    if outcome.error_message:
        print(f"trainguard: {outcome.error_message}", file=err)
    if outcome.failure is not None and outcome.failure.log_tail:
        f = outcome.failure
        print(f"trainguard: last lines of {f.replica}'s log (attempt {f.attempt}):", file=err)
        for line in f.log_tail[-20:]:
            print(f"    {line}", file=err)
    return EXIT_CANCELLED if state is JobState.CANCELLED else EXIT_FAILED


# ------------------------------------------------------------------ readers


def _fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _dump(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def cmd_jobs(args: argparse.Namespace, reader: Reader) -> int:
    rows = reader.jobs(args.limit)
    if args.json:
        _dump(rows)
        return 0
    if not rows:
        print("no jobs yet")
        return 0
    print(f"{'ID':<22} {'NAME':<20} {'STATE':<12} {'ATTEMPTS':>8}  CREATED")
    for r in rows:
        print(
            f"{r['id']:<22} {r['name'][:20]:<20} {r['state']:<12} {r['attempts']:>8}  "
            f"{_fmt_time(r['created_at_s'])}"
            + (f"  ({r['queued_reason']})" if r.get("queued_reason") else "")
        )
    return 0


def cmd_status(args: argparse.Namespace, reader: Reader) -> int:
    view = reader.status(args.job)
    if args.json:
        _dump(view)
        return 0
    print(f"job       {view['id']} ({view['name']})")
    print(f"state     {view['state']}")
    if view.get("queued_reason"):
        print(f"queue     {view['queued_reason']}")
    print(f"attempts  {view['attempts']} ({view['restarts']} restart(s))")
    print(f"created   {_fmt_time(view['created_at_s'])}   ended {_fmt_time(view['ended_at_s'])}")
    if view["error_message"]:
        print(f"error     [{view['error_code']}] {view['error_message']}")
    print(f"logs      {view['log_dir']}")
    print("replicas:")
    for r in view["replicas"]:
        code = "" if r["exit_code"] is None else f" exit {r['exit_code']}"
        sig = f" ({r['signal']})" if r["signal"] else ""
        print(f"  {r['name']:<12} rank {r['rank']:<3} {r['state']:<10} pid {r['pid']}{code}{sig}")
    return 0


def cmd_explain(args: argparse.Namespace, reader: Reader) -> int:
    data = reader.explain(args.job)
    if args.json:
        _dump(data)
    else:
        print_explain(data["job"], data["failures"])
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    c = classify_file(args.log, args.exit_code, args.signal, args.retryable_error)
    print_classification(c, args.json)
    return 0


def cmd_goodput(args: argparse.Namespace, reader: Reader) -> int:
    g = reader.goodput(args.job)
    if args.json:
        _dump(g)
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
        print("(no progress was reported: call sdk.report or trainguard.train.report)")
    return 0


def cmd_stacks(args: argparse.Namespace, reader: Reader) -> int:
    from trainguard.stacks import StackReport, render

    views = reader.stacks(args.job, args.attempt)
    if args.json:
        _dump(views)
        return 0
    if not views:
        where = f" in attempt {args.attempt}" if args.attempt is not None else ""
        print(f"job {args.job} has no stack snapshots{where} (they are taken when it hangs)")
        return 0
    for v in views:
        print(
            f"== attempt {v['attempt']}, {v['kind'].replace('_', ' ')} at "
            f"{_fmt_time(v['at_s'])} (stacks taken in {v['duration_ms']:.0f} ms)"
        )
        print(render(StackReport.from_dict(v["report"])))
    return 0


def cmd_records(args: argparse.Namespace, reader: Reader) -> int:
    rows = reader.records(args.job, args.aggregate)
    if args.aggregate:
        if args.json:
            _dump(rows)
        else:
            print_aggregate(rows)
        return 0
    if args.json:
        _dump(rows)
        return 0
    if not rows:
        print(f"job {args.job} has no restart records ({reader.status(args.job)['state']})")
        return 0
    for r in rows:
        print(
            f"#{r['round']} {_fmt_time(r['at_s'])} node {r['node']} replica {r['replica']} "
            f"code {r['error_code']} source {r['error_source']} class {r['failure_class']}"
        )
        print(f"   message:  {r['error_message']}")
        print(f"   decision: {r['decision']}")
        if r["cascade"]:
            print(f"   cascade:  {r['cascade']} failed after it")
        if r["isolated"]:
            print(f"   isolated: {r['isolated']}")
        if r["snapshot_id"]:
            print(f"   stacks:   trainguard stacks {r['job_id']}")
        phases = ", ".join(
            f"{k[:-3]} {r[k]:.0f} ms"
            for k in ("detect_ms", "stop_ms", "schedule_ms", "start_ms", "first_output_ms")
            if r[k] is not None
        )
        print(f"   phases:   {phases}")
    return 0


def cmd_logs(args: argparse.Namespace, reader: Reader) -> int:
    log = reader.log(args.job, args.replica, args.attempt, args.tail)
    if not log["exists"]:
        print(f"(no output yet: {log['path']})", file=sys.stderr)
        return 0
    sys.stdout.write(log["text"])
    return 0


def cmd_cancel(args: argparse.Namespace, store: Store) -> int:
    from trainguard.control import cancel_deadline_s, request_cancel

    job = store.resolve_job(args.job)
    message = request_cancel(store, job)
    if not message.endswith("cancel requested"):
        print(message)
        return 0
    deadline = time.time() + cancel_deadline_s(job)
    state = JobState(job["state"])
    while time.time() < deadline:
        state = JobState(store.job(job["id"])["state"])
        if state.is_terminal:
            break
        time.sleep(0.1)  # another process's state: the store is all we can watch
    print(f"job {job['id']} {state.value}")
    return 0 if state.is_terminal else EXIT_FAILED


def cmd_remote_cancel(args: argparse.Namespace, client: Client) -> int:
    answer = client.cancel(args.job)
    deadline = time.time() + 60
    state = JobState(answer["state"])
    while not state.is_terminal and time.time() < deadline:
        time.sleep(0.2)
        state = JobState(client.status(answer["id"])["state"])
    if args.json:
        _dump({"id": answer["id"], "state": state.value, "message": answer["message"]})
    else:
        print(f"job {answer['id']} {state.value}")
    return 0 if state.is_terminal else EXIT_FAILED


def cmd_submit(args: argparse.Namespace, client: Client, command: list[str]) -> int:
    spec = build_spec(args, command)
    data = spec.model_dump(mode="json")
    answer = client.submit(data, os.getcwd())
    if args.json:
        _dump(answer)
    else:
        print(answer["id"])
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from trainguard.server import serve
    from trainguard.server_config import load_server_config

    keys = ("host", "port", "cpus", "gpus", "memory", "require_token")
    overrides = {k: getattr(args, k) for k in keys}
    overrides["token"] = _token(args)
    overrides["db"] = args.db
    config = load_server_config(args.config, overrides)
    return serve(config, Path(args.home).resolve() if args.home else None)


def cmd_master(args: argparse.Namespace, store: Store) -> int:
    from trainguard.runner import run_admitted

    outcome = run_admitted(args.job, store)
    return 0 if outcome.state is JobState.SUCCEEDED else EXIT_FAILED


def _client(args: argparse.Namespace, home: Path | None) -> Client | None:
    """`--server`, else $TRAINGUARD_SERVER; for submit, else the server of this home."""
    from trainguard.client import Client

    url = getattr(args, "server", None)
    if url is None and args.cmd == "submit":
        info = (home or default_home()) / "server.json"
        if info.is_file():
            url = json.loads(info.read_text())["url"]
        else:
            raise SpecError(
                [
                    "submit: no server: give --server URL or set TRAINGUARD_SERVER "
                    "(start one with `trainguard server`)"
                ]
            )
    if not url:
        return None
    return Client(url, _token(args) or _home_token_for(url, home or default_home()))


def _home_token_for(url: str, home: Path) -> str | None:
    """The token the server of this home made, for that server only: the URL it wrote in
    server.json, or any loopback address (a token file this user can read is theirs)."""
    from urllib.parse import urlsplit

    from trainguard.server_config import home_token, is_loopback

    if os.environ.get("TRAINGUARD_TOKEN"):
        return None  # the environment's token wins, as before
    info = home / "server.json"
    try:
        written = json.loads(info.read_text()) if info.is_file() else {}
        same = isinstance(written, dict) and written.get("url") == url
    except (OSError, ValueError):
        same = False
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None
    return home_token(home) if same or is_loopback(host) else None


def _token(args: argparse.Namespace) -> str | None:
    """--token-file's content, else --token; None leaves it to $TRAINGUARD_TOKEN."""
    path: Path | None = getattr(args, "token_file", None)
    if path is None:
        return getattr(args, "token", None)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not text"
        raise SpecError([f"--token-file {path}: cannot read it ({why})"]) from None
    if not token:
        raise SpecError([f"--token-file {path}: the file is empty"])
    return token


_READERS: dict[str, Callable[[argparse.Namespace, Reader], int]] = {
    "jobs": cmd_jobs,
    "status": cmd_status,
    "records": cmd_records,
    "explain": cmd_explain,
    "stacks": cmd_stacks,
    "goodput": cmd_goodput,
    "logs": cmd_logs,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, command = split_command(argv)
    try:
        args = _parser().parse_args(head)
        home = Path(args.home).resolve() if args.home else None
        if args.cmd == "classify":
            return cmd_classify(args)
        if args.cmd == "server":
            return cmd_server(args)
        if args.cmd in ("run", "submit"):
            command = command or [c for c in args.command if c != "--"]
        elif command:
            raise SpecError([f"{args.cmd}: unexpected arguments after --: {' '.join(command)}"])
        client = _client(args, home)
        if client is not None:
            if args.cmd == "submit":
                return cmd_submit(args, client, command)
            if args.cmd == "cancel":
                return cmd_remote_cancel(args, client)
            if args.cmd == "resume":
                answer = client.resume(args.job)
                print(f"job {answer['id']} {answer['state']}: {answer['message']}")
                return 0
            return _READERS[args.cmd](args, client)
        store = Store(home, args.db)
        if args.cmd == "run":
            return cmd_run(args, store, command)
        if args.cmd == "_master":
            return cmd_master(args, store)
        reap_interrupted(store)
        if args.cmd == "cancel":
            return cmd_cancel(args, store)
        if args.cmd == "resume":
            return cmd_resume(args, store)
        return _READERS[args.cmd](args, StoreReader(store))
    except SpecError as exc:
        for line in exc.problems:
            print(f"trainguard: {line}", file=sys.stderr)
        return EXIT_USAGE
    except TrainguardError as exc:
        print(f"trainguard: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
