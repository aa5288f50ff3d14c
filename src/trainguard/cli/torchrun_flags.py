"""torchrun's command line, one word changed (issue 41): `trainguard run train.py --lr 0.1`
runs `python train.py --lr 0.1` with the interpreter trainguard runs under, `-m pkg.mod`
a module, `--no-python` the command as given; torchrun's own spellings of the flags that
mean the same are accepted, and its rendezvous flags are refused with why."""

from __future__ import annotations

import argparse
import sys

from trainguard.errors import SpecError

RDZV = ("rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf")
"""torchrun's rendezvous flags: trainguard holds the rendezvous (MASTER_ADDR, MASTER_PORT)."""


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
    for name in RDZV:
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
    given. SpecError names a flag torchrun has and trainguard refuses."""
    given = [f"--{n}" for n in RDZV if getattr(args, f"torchrun_{n.replace('-', '_')}", None)]
    if given:
        raise SpecError(
            [
                f"{', '.join(given)}: trainguard holds the rendezvous itself (it sets "
                "MASTER_ADDR and MASTER_PORT for every attempt): drop the flag"
            ]
        )
    if args.module and args.no_python:
        raise SpecError(["-m and --no-python: give one of them"])
    if args.module:
        if not command:
            raise SpecError(["-m: name the module to run, e.g. trainguard run -m pkg.train"])
        return [sys.executable, "-m", *command]
    if not args.no_python and command and command[0].endswith(".py"):
        return [sys.executable, *command]
    return command
