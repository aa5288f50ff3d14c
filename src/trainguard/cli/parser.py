"""The command line's grammar: every subcommand, its flags and their bounds."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard import __version__

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130


INTERNAL = ("_master",)
"""Commands trainguard runs itself (the server starts a job's master): never shown."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, no usage dump
        for name in INTERNAL:
            message = message.replace(f", {name!r}", "")
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _seconds(text: str) -> float:
    """An argparse type: an interval from 0.1 s to a day, else one line saying so."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"must be from 0.1 to 86400 seconds, got {text}")
    return value


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


def _exit_status(text: str) -> int:
    """An argparse type: an exit status as a shell shows it (0 to 255), else one line."""
    try:
        value = int(text)
    except ValueError:
        if text.strip().lstrip("-").isdecimal():  # past int()'s 4300 digits
            raise argparse.ArgumentTypeError(f"must be from 0 to 255, got {text[:40]}...") from None
        raise argparse.ArgumentTypeError(f"must be an integer, got {text[:40]!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"must be from 0 to 255, got {value}: a death by signal N is --signal N"
        )
    if value > 255:
        raise argparse.ArgumentTypeError(f"must be from 0 to 255, got {text[:40]}")
    return value


_MANY = 10**9  # more lines, jobs or attempts than any store holds


SPEC_COMMANDS = ("run", "submit", "validate")
"""The commands whose flags build a job spec (`spec_flags`: they import the spec's models,
which the other commands do without, so `status` answers in about half the time)."""


def command_of(head: list[str]) -> str | None:
    """The subcommand `head` names (its first word that is no top-level option or its
    value), or None: then the whole grammar is built, for help and errors."""
    i = 0
    while i < len(head):
        word = head[i]
        if word in ("--home", "--db"):
            i += 2
            continue
        if not word.startswith("-"):
            return word
        i += 1
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The grammar; given the `command` about to be parsed, without the spec flags of
    the commands it is not (`SPEC_COMMANDS`)."""
    p = _Parser(prog="trainguard", description="Fault-tolerance master for distributed training.")
    p.add_argument("--version", action="version", version=f"trainguard {__version__}")
    p.add_argument("--home", help="state directory (default: $TRAINGUARD_HOME or ./.trainguard)")
    p.add_argument(
        "--db",
        default=os.environ.get("TRAINGUARD_DB"),
        help="store URL, e.g. postgresql+psycopg://user@host/db (default: $TRAINGUARD_DB, "
        "else a SQLite file in the state directory)",
    )
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")

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
    sb = sub.add_parser("submit", parents=[remote], help="queue a job on a trainguard server")
    check = sub.add_parser(
        "validate", help="check a job spec and run's flags as run would; store and start nothing"
    )
    if command is None or command in SPEC_COMMANDS:
        from trainguard.cli.spec_flags import add_spec_flags
        from trainguard.cli.torchrun_flags import add_torchrun_flags

        for each in (run, sb, check):
            add_spec_flags(each)
            add_torchrun_flags(each)
    check.add_argument("--json", action="store_true", help="print the whole spec, defaults filled")
    run.add_argument("--quiet", action="store_true", help="do not tee replica output")
    run.add_argument(
        "--plain", action="store_true", help="plain lines, no live panel (as in a pipe)"
    )
    run.add_argument(
        "--resume",
        action="store_true",
        help="resume the job of this name if it was interrupted or cancelled, else start it",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

    sb.add_argument("--json", action="store_true")
    sb.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    check.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

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
    res.add_argument(
        "--plain", action="store_true", help="plain lines, no live panel (as in a pipe)"
    )

    jobs = sub.add_parser("jobs", parents=[remote], help="list jobs")
    jobs.add_argument("--json", action="store_true")
    jobs.add_argument("--limit", type=_count(1, _MANY), default=50)

    nd = sub.add_parser(
        "nodes", parents=[remote], help="nodes with machine-blamed failures; release NODE"
    )
    nd.add_argument("action", nargs="?", choices=("release",), help="release: forgive NODE")
    nd.add_argument("node", nargs="?", help="the node to release")
    nd.add_argument("--json", action="store_true")

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
        if name == "status":
            sp.add_argument(
                "-w",
                "--watch",
                nargs="?",
                const=2.0,
                type=_seconds,
                metavar="SECONDS",
                help="show it again every SECONDS (default 2) until the job ends",
            )

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
        "--attempt", type=_count(0, _MANY), help="the attempt (default: every stack dump)"
    )
    st.add_argument("--json", action="store_true")

    ag = sub.add_parser(
        "agent",
        help="a node agent: runs this node's replicas of a job for its master (started by "
        "the backend; the job's token in $TRAINGUARD_AGENT_TOKEN)",
    )
    ag.add_argument("master", help="the master's agent address, HOST:PORT")
    ag.add_argument("job", help="the job's id")
    ag.add_argument(
        "--node",
        help="this node's name (default: $SLURMD_NODENAME, else the host name)",
    )

    cl = sub.add_parser("classify", help="classify a log file offline, as the master would")
    cl.add_argument("log", type=Path, help="a replica's log file")
    died = cl.add_mutually_exclusive_group()
    died.add_argument(
        "--exit-code",
        type=_exit_status,
        help="the exit status, 0 to 255 (default 1); 139 means SIGSEGV",
    )
    died.add_argument("--signal", help="or the signal that killed it, e.g. SIGKILL")
    cl.add_argument("--retryable-error", action="append", default=[], help="a job keyword")
    cl.add_argument(
        "--progressed",
        choices=("yes", "no"),
        help="had the job trained before it failed (what a live master knows; sets the phase)",
    )
    cl.add_argument("--json", action="store_true")

    co = sub.add_parser("completion", help="a shell completion script: bash or zsh")
    co.add_argument("shell", choices=("bash", "zsh"))

    logs = sub.add_parser("logs", parents=[remote], help="a replica's log")
    logs.add_argument("job", help="job id or name")
    logs.add_argument("--replica", help="replica name, e.g. worker-1 (default: the primary)")
    logs.add_argument("--attempt", type=_count(0, _MANY), help="attempt number (default: the last)")
    logs.add_argument("--tail", type=_count(1, _MANY), help="only the last N lines")
    return p


# ------------------------------------------------------------------ run


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
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
