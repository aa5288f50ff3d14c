"""Tokens the master and the server make can be given back on a command line."""

from __future__ import annotations

from trainguard.storage.ids import new_token


def test_a_new_token_never_reads_as_an_option() -> None:
    # token_urlsafe starts with "-" one time in 64: `--token -x...` then failed in argparse
    tokens = {new_token() for _ in range(2000)}
    assert len(tokens) == 2000
    assert not any(t.startswith("-") for t in tokens)
