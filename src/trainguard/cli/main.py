"""`trainguard`: run a job here, or look at the jobs in the store.

Every user mistake ends in one clear line (or one per problem) and exit status 2;
never in a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.classify.logtail import printable
from trainguard.cli import completion
from trainguard.cli.nodes import LocalNodes, RemoteNodes, cmd_nodes
from trainguard.cli.parser import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_USAGE,
    SPEC_COMMANDS,
    build_parser,
    command_of,
    split_command,
)
from trainguard.cli.readers import (
    cmd_classify,
    cmd_explain,
    cmd_goodput,
    cmd_jobs,
    cmd_logs,
    cmd_records,
    cmd_stacks,
    cmd_status,
    dump_json,
)
from trainguard.errors import JobNotFound, ResumeError, SpecError, TrainguardError
from trainguard.records.engine import default_home
from trainguard.records.liveness import reap_interrupted
from trainguard.records.queries import Reader, StoreReader
from trainguard.records.rows import JobRow
from trainguard.records.store import Store
from trainguard.spec.text import not_utf8_problem
from trainguard.states import JobState

if TYPE_CHECKING:
    from trainguard.cli.client import Client
    from trainguard.cli.live import LiveRun
    from trainguard.master.events import Outcome
    from trainguard.spec.models import JobSpec


def cmd_run(args: argparse.Namespace, store: Store, spec: JobSpec) -> int:
    from trainguard.master.runner import resume_job, run_job
    from trainguard.storage.ids import new_job_id

    job = _resumable(store, spec.name) if args.resume else None
    with _terminal(args, store) as live:
        tee = None if args.quiet else sys.stdout  # under the panel: its redirection
        say = live.say if live is not None else None
        if job is not None:
            live_job(live, str(job.id))
            return _report(*resume_job(job, store, tee=tee, say=say))
        job_id = new_job_id()
        live_job(live, job_id)
        return _report(*run_job(spec, store, tee=tee, say=say, job_id=job_id))


def _resumable(store: Store, name: str) -> JobRow | None:
    """`run --resume`: the job of that name to continue; None: start a new one."""
    from trainguard.records.control import RESUMABLE

    reap_interrupted(store)
    try:
        job = store.resolve_job(name)
    except JobNotFound:
        return None
    if JobState(job.state) in RESUMABLE:
        return job
    if not JobState(job.state).is_terminal:
        raise ResumeError(f"job {job.id} ({name}) is {job.state}: it still runs")
    return None


def cmd_resume(args: argparse.Namespace, store: Store) -> int:
    from trainguard.master.runner import resume_job

    job = store.resolve_job(args.job)
    with _terminal(args, store) as live:
        live_job(live, str(job.id))
        tee = None if args.quiet else sys.stdout
        say = live.say if live is not None else None
        return _report(*resume_job(job, store, tee=tee, say=say))


def live_job(live: LiveRun | None, job_id: str) -> None:
    if live is not None:
        live.job_id = job_id


@contextlib.contextmanager
def _terminal(args: argparse.Namespace, store: Store) -> Iterator[LiveRun | None]:
    """The live panel on a terminal (not with --plain, nor when stdout is a pipe or a
    file); None: plain lines, as before."""
    if getattr(args, "plain", False) or not sys.stdout.isatty():
        yield None
        return
    from trainguard.cli.live import LiveRun

    with LiveRun(StoreReader(store), sys.stdout) as live:
        yield live


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
        print(f"trainguard: {printable(outcome.error_message)}", file=err)
    if outcome.failure is not None and outcome.failure.log_tail:
        f = outcome.failure
        print(f"trainguard: last lines of {f.replica}'s log (attempt {f.attempt}):", file=err)
        for line in f.log_tail[-20:]:
            print(f"    {printable(line)}", file=err)
    return EXIT_CANCELLED if state is JobState.CANCELLED else EXIT_FAILED


# ------------------------------------------------------------------ readers


def cmd_cancel(args: argparse.Namespace, store: Store) -> int:
    from trainguard.records.control import cancel_deadline_s, request_cancel

    job = store.resolve_job(args.job)
    message = request_cancel(store, job)
    if not message.endswith("cancel requested"):
        print(message)
        return 0
    deadline = time.time() + cancel_deadline_s(job)
    state = JobState(job.state)
    while time.time() < deadline:
        state = JobState(store.job(job.id).state)
        if state.is_terminal:
            break
        time.sleep(0.1)  # another process's state: the store is all we can watch
    print(f"job {job.id} {state.value}")
    return 0 if state.is_terminal else EXIT_FAILED


def cmd_remote_cancel(args: argparse.Namespace, client: Client) -> int:
    answer = client.cancel(args.job)
    deadline = time.time() + 60
    state = JobState(answer["state"])
    while not state.is_terminal and time.time() < deadline:
        time.sleep(0.2)
        state = JobState(client.status(answer["id"])["state"])
    if args.json:
        dump_json({"id": answer["id"], "state": state.value, "message": answer["message"]})
    else:
        print(f"job {answer['id']} {state.value}")
    return 0 if state.is_terminal else EXIT_FAILED


def cmd_submit(args: argparse.Namespace, client: Client, spec: JobSpec) -> int:
    data = spec.model_dump(mode="json")
    answer = client.submit(data, os.getcwd())
    if args.json:
        dump_json(answer)
    else:
        print(answer["id"])
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    from trainguard.service.config import load_server_config
    from trainguard.service.server import serve

    keys = ("host", "port", "cpus", "gpus", "memory", "require_token")
    overrides = {k: getattr(args, k) for k in keys}
    overrides["token"] = _token(args)
    overrides["db"] = args.db
    config = load_server_config(args.config, overrides)
    return serve(config, Path(args.home).resolve() if args.home else None)


def cmd_master(args: argparse.Namespace, store: Store) -> int:
    from trainguard.master.runner import run_admitted

    outcome = run_admitted(args.job, store)
    return 0 if outcome.state is JobState.SUCCEEDED else EXIT_FAILED


def _client(args: argparse.Namespace, home: Path | None) -> Client | None:
    """`--server`, else $TRAINGUARD_SERVER; for submit, else the server of this home."""
    home = home or default_home()
    url = getattr(args, "server", None)
    if url is None and args.cmd == "submit":
        url = _home_server_url(home)
        if url is None:
            raise SpecError(
                [
                    "submit: no server: give --server URL or set TRAINGUARD_SERVER "
                    "(start one with `trainguard server`)"
                ]
            )
    if not url:
        _token(args)  # a --token-file that cannot be read is named, server or not
        return None
    from trainguard.cli.client import Client

    return Client(url, _token(args), home_token=_home_token_for(url, home))


def _home_server_url(home: Path) -> str | None:
    """The URL the server of this home wrote in server.json, if one runs."""
    try:
        written = json.loads((home / "server.json").read_text())
    except (OSError, ValueError):
        return None
    url = written.get("url") if isinstance(written, dict) else None
    return url if isinstance(url, str) else None


def _home_token_for(url: str, home: Path) -> str | None:
    """The token the server of this home made, for that server only: the URL it wrote in
    server.json, or any loopback address (a token file this user can read is theirs)."""
    from urllib.parse import urlsplit

    from trainguard.service.config import home_token, is_loopback

    if os.environ.get("TRAINGUARD_TOKEN"):
        return None  # the environment's token wins, as before
    try:
        host = urlsplit(url).hostname or ""
    except ValueError:
        return None
    ours = url == _home_server_url(home) or is_loopback(host)
    return home_token(home) if ours else None


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


_TEXT_ARGS = {
    "job": "job",
    "replica": "--replica",
    "server": "--server",
    "token": "--token",
    "host": "--host",
    "node": "node",
}
"""Arguments that reach the store or the network as text (paths may hold any bytes)."""


def _utf8_args(args: argparse.Namespace) -> None:
    """A job id, a replica, a URL with an undecodable byte: one line, not a traceback."""
    for dest, flag in _TEXT_ARGS.items():
        value = getattr(args, dest, None)
        line = not_utf8_problem(flag, value) if isinstance(value, str) else None
        if line:
            raise SpecError([line])


_READERS: dict[str, Callable[[argparse.Namespace, Reader], int]] = {
    "jobs": cmd_jobs,
    "status": cmd_status,
    "records": cmd_records,
    "explain": cmd_explain,
    "stacks": cmd_stacks,
    "goodput": cmd_goodput,
    "logs": cmd_logs,
}


def _remote(args: argparse.Namespace, client: Client, spec: JobSpec | None) -> int:
    """A command against a server (`--server`, $TRAINGUARD_SERVER, or submit's own)."""
    if args.cmd == "submit" and spec is not None:
        return cmd_submit(args, client, spec)
    if args.cmd == "cancel":
        return cmd_remote_cancel(args, client)
    if args.cmd == "nodes":
        return cmd_nodes(args, RemoteNodes(client))
    if args.cmd == "resume":
        answer = client.resume(args.job)
        print(f"job {answer['id']} {answer['state']}: {answer['message']}")
        return 0
    return _READERS[args.cmd](args, client)


def _local(args: argparse.Namespace, store: Store, spec: JobSpec | None) -> int:
    """A command against this machine's store."""
    if args.cmd == "run" and spec is not None:
        return cmd_run(args, store, spec)
    if args.cmd == "_master":
        return cmd_master(args, store)
    reap_interrupted(store)
    if args.cmd == "cancel":
        return cmd_cancel(args, store)
    if args.cmd == "resume":
        return cmd_resume(args, store)
    if args.cmd == "nodes":
        return cmd_nodes(args, LocalNodes(store))
    return _READERS[args.cmd](args, StoreReader(store))


def _validated(spec: JobSpec, as_json: bool) -> int:
    """`trainguard validate`: the spec that `run` would start, said in one line (or whole)."""
    if as_json:
        print(json.dumps(spec.model_dump(mode="json"), indent=2))
        return 0
    replicas = sum(p.replicas for p in spec.worker_pools)
    pools = len(spec.worker_pools)
    print(
        f"ok: job {spec.name}: {replicas} replica(s) in {pools} pool(s), framework "
        f"{spec.framework}, backend {spec.backend}"
    )
    return 0


def _node_name() -> str:
    """This node as its scheduler names it (Slurm), else as the network does."""
    import socket

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    head, command = split_command(argv)
    try:
        args = build_parser(command_of(head)).parse_args(head)
        _utf8_args(args)
        home = Path(args.home).resolve() if args.home else None
        if args.cmd == "classify":
            return cmd_classify(args)
        if args.cmd == "completion":
            print(completion.script(build_parser(), args.shell), end="")
            return 0
        if args.cmd == "server":
            return cmd_server(args)
        if args.cmd == "agent":
            from trainguard.backends.agent.node import main as agent

            return agent([args.master, args.job, args.node or _node_name()])
        spec = None  # a job's spec is checked before anything is stored or sent
        if args.cmd in SPEC_COMMANDS:
            from trainguard.cli.spec_flags import build_spec
            from trainguard.cli.torchrun_flags import program

            given = command or [c for c in args.command if c != "--"]
            spec = build_spec(args, program(args, given))
            if args.cmd == "validate":
                return _validated(spec, args.json)
        elif command:
            raise SpecError([f"{args.cmd}: unexpected arguments after --: {' '.join(command)}"])
        client = _client(args, home)
        if client is not None:
            return _remote(args, client, spec)
        return _local(args, Store(home, args.db), spec)
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
