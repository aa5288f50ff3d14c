"""`trainguard`: run a job here, or look at the jobs in the store.

Every user mistake ends in one clear line (or one per problem) and exit status 2;
never in a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from trainguard.frameworks import PRESETS
from trainguard.ft_args import parse_ft_args
from trainguard.liveness import reap_interrupted
from trainguard.queries import Reader, StoreReader
from trainguard.spec import JobSpec, load_spec_file, validate_spec
from trainguard.states import JobState
from trainguard.store import Store, default_home

if TYPE_CHECKING:
    from trainguard.client import Client
    from trainguard.master import Outcome

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130

# CLI flag -> fault_tolerance field (one to one; None = the flag's own name).
_FT_FLAGS = {
    "execution_mode": "--execution-mode",
    "fault_tolerant_policy": "--fault-tolerant-policy",
    "enable_job_restart": "--enable-job-restart",
    "max_num_of_job_restart": "--max-restarts",
    "max_replica_restarts": "--max-replica-restarts",
    "max_transient_restarts": "--max-transient-restarts",
    "max_num_of_same_error": "--max-num-of-same-error",
    "max_tolerated_failure_rate": "--max-tolerated-failure-rate",
    "enable_job_hang_detection": "--enable-job-hang-detection",
    "job_hang_interval": "--job-hang-interval",
    "enable_job_exit_hang_detection": "--enable-job-exit-hang-detection",
    "job_exit_hang_interval": "--job-exit-hang-interval",
    "stop_grace_period_s": "--stop-grace-period",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    """The flags that build a job spec: the same for `run` and `submit`."""
    p.add_argument("-f", "--file", type=Path, help="job spec (YAML)")
    p.add_argument("--job-name", dest="name", help="the job's name")
    p.add_argument("--nproc-per-node", "--nproc", dest="nproc", help="replicas of the command")
    p.add_argument("--framework", help=f"{', '.join(PRESETS)} (default pytorch)")
    p.add_argument(
        "--allow-partial",
        action="store_const",
        const=True,
        help="batch: a shard that cannot be retried is given up and listed; the rest finish",
    )
    p.add_argument("--success-policy", help="chief (default) or all")
    p.add_argument(
        "--from-checkpoint",
        dest="initial_checkpoint",
        metavar="PATH",
        help="checkpoint.initial: start a new job from this checkpoint folder",
    )
    p.add_argument("--gpus", help="gpu_inventory: the GPU ids to use here, e.g. 0,1,2,3")
    p.add_argument(
        "--inject",
        action="append",
        dest="fault_injection",
        metavar="SPEC",
        help="fault_injection: e.g. signal:worker-1:SIGKILL@20s, stop:worker-0@step=50, master@30s",
    )
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="replica env")
    p.add_argument(
        "--retryable-error",
        action="append",
        dest="retryable_errors",
        metavar="REGEX",
        help="fault_tolerance.retryable_errors: a log text worth a retry (repeatable)",
    )
    for field, flag in _FT_FLAGS.items():
        p.add_argument(flag, dest=field, help=f"fault_tolerance.{field}")
    p.add_argument("--ft-args", help='AIMaster arguments, e.g. "--job-execution-mode=Sync ..."')
    p.add_argument(
        "--preload",
        help="preload: modules to import once and fork replicas from, e.g. torch (warm start)",
    )
    p.add_argument("--backend", help="backend: local (default) or ray")
    p.add_argument("--ray-address", help="ray.address: auto, HOST:PORT or ray://HOST:10001")
    p.add_argument("--placement-strategy", help="ray.placement_strategy: spread or pack")
    p.add_argument("--priority", help="queue.priority: higher runs first (server queue)")
    p.add_argument("--max-wait", dest="max_wait_s", help="queue.max_wait_s: then EXPIRED")
    p.add_argument(
        "--wait-for-capacity",
        action="store_true",
        default=None,
        help="queue.wait_for_capacity: wait rather than fail on a capacity shortage",
    )


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
    remote.add_argument("--token", help="the server's token (default: $TRAINGUARD_TOKEN)")

    run = sub.add_parser("run", help="run a job and supervise it until it ends")
    _add_spec_flags(run)
    run.add_argument("--quiet", action="store_true", help="do not tee replica output")
    run.add_argument(
        "--resume",
        action="store_true",
        help="resume the job of this name if it was interrupted or cancelled, else start it",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

    sb = sub.add_parser("submit", parents=[remote], help="queue a job on a trainguard server")
    _add_spec_flags(sb)
    sb.add_argument("--json", action="store_true")
    sb.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

    srv = sub.add_parser("server", help="run the service: queue, HTTP API, web page")
    srv.add_argument("--config", type=Path, help="server settings (YAML)")
    srv.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, help="port (default 8470; 0 picks a free one)")
    srv.add_argument("--token", help="require this token (default: $TRAINGUARD_TOKEN)")
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
    jobs.add_argument("--limit", type=int, default=50)

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
    st.add_argument("--attempt", type=int, help="the attempt (default: every snapshot)")
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
    logs.add_argument("--attempt", type=int, help="attempt number (default: the last)")
    logs.add_argument("--tail", type=int, help="only the last N lines")
    return p


# ------------------------------------------------------------------ run


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """Options before `--`, the replica command after it.

    `--ft-args "--job-execution-mode=Sync ..."` is glued into one token first: its value
    starts with `--`, which argparse would otherwise take for an option of its own.
    """
    head: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return head, argv[i + 1 :]
        if argv[i] == "--ft-args" and i + 1 < len(argv):
            head.append(f"--ft-args={argv[i + 1]}")
            i += 2
            continue
        head.append(argv[i])
        i += 1
    return head, []


def build_spec(args: argparse.Namespace, command: list[str]) -> JobSpec:
    """Spec file, then --ft-args, then explicit flags: each later source wins."""
    data: dict[str, Any] = load_spec_file(args.file) if args.file else {}
    problems: list[str] = []
    if command:
        if data.get("worker_pools"):
            problems.append("command: give either a spec with worker_pools or a command, not both")
        else:
            name = args.framework or data.get("framework") or "pytorch"
            replicas = args.nproc if args.nproc is not None else 1
            if name in PRESETS:  # else the spec's check names the framework
                data["worker_pools"] = PRESETS[name].pools_for(command, replicas)
    elif not data.get("worker_pools"):
        problems.append(
            "command: none given; put it after --, e.g. "
            "`trainguard run --nproc-per-node 2 -- python train.py`, or use -f job.yaml"
        )
    elif args.nproc is not None:
        problems.append("--nproc-per-node: applies to a command, not to a spec's worker_pools")
    if args.env and data.get("worker_pools"):
        extra: dict[str, str] = {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep or not key:
                problems.append(f"--env: must be KEY=VALUE, got {item!r}")
            extra[key] = value
        data["worker_pools"] = [
            {**p, "env": {**p.get("env", {}), **extra}} if isinstance(p, dict) else p
            for p in data["worker_pools"]
        ]
    if problems:
        raise SpecError(problems)
    ft: dict[str, Any] = dict(data.get("fault_tolerance") or {})
    if args.ft_args:
        ft.update(parse_ft_args(args.ft_args))
    for field in _FT_FLAGS:
        value = getattr(args, field)
        if value is not None:
            ft[field] = value
    if args.retryable_errors:
        ft["retryable_errors"] = [*ft.get("retryable_errors", []), *args.retryable_errors]
    data["fault_tolerance"] = ft
    for key in ("name", "framework", "success_policy", "allow_partial"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    if args.initial_checkpoint is not None:
        path = Path(args.initial_checkpoint)
        if not path.is_dir():
            raise SpecError([f"--from-checkpoint: not a folder: {args.initial_checkpoint!r}"])
        data["checkpoint"] = {**(data.get("checkpoint") or {}), "initial": str(path.resolve())}
    if args.fault_injection:
        data["fault_injection"] = [*data.get("fault_injection", []), *args.fault_injection]
    ray: dict[str, Any] = dict(data.get("ray") or {})
    for key, dest in (("address", "ray_address"), ("placement_strategy", "placement_strategy")):
        if getattr(args, dest) is not None:
            ray[key] = getattr(args, dest)
    if ray:
        data["ray"] = ray
    if args.preload is not None:
        data["preload"] = [m.strip() for m in args.preload.split(",") if m.strip()]
    if args.backend is not None:
        data["backend"] = args.backend
    elif args.ray_address is not None:
        data["backend"] = "ray"  # --ray-address alone says where
    queue: dict[str, Any] = dict(data.get("queue") or {})
    for key in ("priority", "max_wait_s", "wait_for_capacity"):
        if getattr(args, key) is not None:
            queue[key] = getattr(args, key)
    data["queue"] = queue
    if args.gpus is not None:
        data["gpu_inventory"] = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if "name" not in data and command:
        data["name"] = _default_name(command)
    try:
        return validate_spec(data)
    except SpecError as exc:
        raise SpecError([_name_the_flag(line, args) for line in exc.problems]) from None


def _name_the_flag(line: str, args: argparse.Namespace) -> str:
    """`fault_tolerance.max_num_of_job_restart: ...` also names the flag that set it."""
    flags = {f"fault_tolerance.{f}": flag for f, flag in _FT_FLAGS.items()}
    flags.update(name="--job-name", framework="--framework", success_policy="--success-policy")
    flags["allow_partial"] = "--allow-partial"
    flags["gpu_inventory"] = "--gpus"
    flags.update({"queue.priority": "--priority", "queue.max_wait_s": "--max-wait"})
    flags.update({"backend": "--backend", "ray.placement_strategy": "--placement-strategy"})
    flags["preload"] = "--preload"
    field = line.split(":", 1)[0]
    if field.startswith("fault_injection") and getattr(args, "fault_injection", None):
        return f"{line} (from --inject)"
    dest = field.rsplit(".", 1)[-1]
    if field in flags and getattr(args, dest, None) is not None:
        return f"{line} (from {flags[field]})"
    return line


def _default_name(command: list[str]) -> str:
    """`python train.py` -> `train`; `./run.sh` -> `run`; otherwise the program's name."""
    script = next((w for w in command if w.endswith((".py", ".sh"))), command[0])
    stem = Path(script).stem
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem).strip("-._")[:60] or "job"


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

    overrides = {k: getattr(args, k) for k in ("host", "port", "token", "cpus", "gpus", "memory")}
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
    return Client(url, getattr(args, "token", None)) if url else None


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
    head, command = _split_command(argv)
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
