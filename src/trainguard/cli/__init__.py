"""The command line: the parser and commands, the `run` flags as a spec, the HTTP client."""

from trainguard.cli.main import main

__all__ = ["client", "completion", "main", "parser", "readers", "spec_flags"]
