"""torchrun's command line, one word changed (issue 41): `trainguard run train.py --lr 0.1`
runs `python train.py --lr 0.1` with the interpreter trainguard runs under, `-m pkg.mod`
a module, `--no-python` the command as given; torchrun's own spellings of the flags that
mean the same are accepted, and its rendezvous flags are refused with why."""

from __future__ import annotations

import argparse
import sys

from trainguard.errors import SpecError

RDZV = ("rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf", "master-addr", "master-port")
"""torchrun's rendezvous flags: trainguard holds the rendezvous (MASTER_ADDR, MASTER_PORT)."""
PER_NODE = ("node-rank",)
"""torchrun's flags of one launcher per node: trainguard starts every node's ranks itself."""


def add_torchrun_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="torchrun's -m: the command is a Python module (python -m MODULE ARGS)",
    )
    p.add_argument(
        "--no-python",
        "--no_python",
        dest="no_python",
        action="store_true",
        help="torchrun's --no-python: run the command as given (a .py file included)",
    )
    p.add_argument(
        "--standalone",
        action="store_true",
        help="torchrun's --standalone: accepted (trainguard's rendezvous is always its own)",
    )
    p.add_argument(
        "--nnodes",
        dest="torchrun_nnodes",
        metavar="N",
        help="torchrun's --nnodes: --nodes (trainguard places the nodes and starts their ranks)",
    )
    for name in (*RDZV, *PER_NODE):
        p.add_argument(
            f"--{name}",
            f"--{name.replace('-', '_')}",
            dest=f"torchrun_{name.replace('-', '_')}",
            metavar="VALUE",
            help=argparse.SUPPRESS,
        )


def program(args: argparse.Namespace, command: list[str]) -> list[str]:
    """The replica command as torchrun would run it: a `.py` file with this interpreter,
    a module (`-m`) with `python -m`, anything else (or all, with `--no-python`) as
    given; torchrun's `--nnodes` becomes `args.nodes`. SpecError names a flag torchrun has
    and trainguard refuses."""
    problems = []
    rdzv, per_node = _given(args, RDZV), _given(args, PER_NODE)
    if rdzv:
        problems.append(
            f"{', '.join(rdzv)}: trainguard holds the rendezvous itself (it sets "
            "MASTER_ADDR and MASTER_PORT for every attempt): drop the flag"
        )
    if per_node:
        problems.append(
            f"{', '.join(per_node)}: trainguard starts the ranks of every node itself: "
            "run one `trainguard run` for the job (e.g. in the batch script), not one per node"
        )
    nnodes = _nnodes(args)
    if nnodes:
        problems.append(nnodes)
    if problems:
        raise SpecError(problems)
    if args.module and args.no_python:
        raise SpecError(["-m and --no-python: give one of them"])
    if args.module:
        if not command:
            raise SpecError(["-m: name the module to run, e.g. trainguard run -m pkg.train"])
        return [sys.executable, "-m", *command]
    if not args.no_python and command and command[0].endswith(".py"):
        return [sys.executable, *command]
    return command


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    return [f"--{n}" for n in names if getattr(args, f"torchrun_{n.replace('-', '_')}", None)]


def _nnodes(args: argparse.Namespace) -> str:
    """torchrun's `--nnodes N` as `--nodes N`; a problem's line, or ""."""
    given = getattr(args, "torchrun_nnodes", None)
    if given is None:
        return ""
    if ":" in given:
        return (
            f"--nnodes {given}: torchrun's elastic MIN:MAX is not supported; give the "
            "number of nodes (trainguard restarts the job on the nodes it has)"
        )
    if not given.strip().isdecimal():
        return f"--nnodes: must be a whole number of nodes, got {given!r}"
    if args.nodes is not None and args.nodes != given:
        return f"--nnodes {given} and --nodes {args.nodes}: give one of them"
    args.nodes = given
    return ""
