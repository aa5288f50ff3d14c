"""The command line: the parser and commands, the `run` flags as a spec (torchrun's words
among them), the HTTP client, the tables and the live panel of `run`."""

from trainguard.cli.main import main

__all__ = [
    "client",
    "completion",
    "live",
    "main",
    "nodes",
    "parser",
    "readers",
    "render",
    "spec_flags",
    "torchrun_flags",
]
