"""Does this host see the job's checkpoint storage? The check a remote host makes before it
starts a replica (a folder on the master's own disk is empty on every other machine: a
replica there would find no checkpoint and silently start again from step 0).

The master writes a marker with a random token into the storage at the job's start
(`storage.checkpoints.write_marker`) and hands each replica the token; a host that reads
the same token back sees the same storage. Standard library and fsspec only: this runs
on every node, inside the replica host (a URL in a process of its own, with the replica's
environment: that is where the object store's credentials are).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from trainguard.storage.checkpoints import STORAGE_CHECK
from trainguard.storage.env import ENV_CHECKPOINT_DIR, ENV_STORAGE_CHECK


def _read(storage: str) -> bytes:
    if "://" not in storage:
        return (Path(storage) / STORAGE_CHECK).read_bytes()
    import fsspec  # type: ignore[import-untyped]

    with fsspec.open(f"{storage.rstrip('/')}/{STORAGE_CHECK}", "rb") as fh:
        return bytes(fh.read())


def marker_problem(storage: str, token: str) -> str | None:
    """None if this host reads back the master's marker; else what it found instead."""
    try:
        found = _read(storage)
    except FileNotFoundError:
        return "the marker the master wrote there is not there"
    except Exception as exc:  # any fsspec backend's error: this host cannot read it
        return f"cannot read it: {type(exc).__name__}: {str(exc)[:200]}"
    if found.decode(errors="replace") != token:
        return "it holds another job's marker: not the master's storage"
    return None


_CHECK_S = 8.0
"""An object store that answers nothing this long is as good as unseen (and the master
gives a replica's start 10 s before it counts its node lost)."""


def _in_env(storage: str, token: str, env: Mapping[str, str]) -> str | None:
    """`marker_problem` for a URL, in a process with the replica's environment: an object
    store's credentials and endpoint are in the job's environment, not this host's."""
    code = (
        "import sys; from trainguard.backends.storage_check import marker_problem; "
        "print(marker_problem(sys.argv[1], sys.argv[2]) or '', end='')"
    )
    try:
        res = subprocess.run(
            [sys.executable, "-c", code, storage, token],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=_CHECK_S,
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {_CHECK_S:g} s"
    if res.returncode:
        last = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        return f"the check failed: {last[:200]}"
    return res.stdout or None


def storage_problem(env: Mapping[str, str]) -> str | None:
    """Why this host cannot use the job's checkpoint storage, in one line; None if it can
    (or the master asked for no check)."""
    storage, token = env.get(ENV_CHECKPOINT_DIR), env.get(ENV_STORAGE_CHECK)
    if not storage or not token:
        return None
    why = marker_problem(storage, token) if "://" not in storage else _in_env(storage, token, env)
    if why is None:
        return None
    return (
        f"host {socket.gethostname()} does not see the checkpoint storage {storage} ({why}): "
        "set checkpoint.storage to a shared folder or an fsspec URL every host of the job sees"
    )
