"""Fresh job ids and secrets, standard library only: the CLI, the embedded master and the
server's queue each mint them, and none of them needs the master's code for it."""

from __future__ import annotations

import secrets
import time

_TOKEN_BYTES = 32


def new_job_id() -> str:
    """`tg-YYYYMMDD-xxxxxx`: the day it was made, and 24 random bits."""
    return f"tg-{time.strftime('%Y%m%d')}-{secrets.token_hex(3)}"


def new_token() -> str:
    """A random secret (a job's TRAINGUARD_TOKEN, a server's token).

    It never starts with "-", so `--token TOKEN` cannot be read as an option.
    """
    return "tg" + secrets.token_urlsafe(_TOKEN_BYTES)
