"""A private PostgreSQL server for the tests, started from Debian's packages.

`postgres_url` (session scope) runs initdb and pg_ctl in a fresh temporary directory,
listening on 127.0.0.1 only, on a free port, with trust authentication, and yields the URL
of its `trainguard` database. PostgreSQL refuses to run as root, so as root the server runs
as the `postgres` user. Missing binaries fail the tests (scripts/system_deps.sh installs
them) rather than skip them: a skipped test would let the PostgreSQL store go untested.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.backends.net import free_port

USER = "postgres"
LIB = Path("/usr/lib/postgresql")  # where Debian's packages put the server


def _bin_dir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin that holds initdb."""
    found = sorted(
        LIB.glob("*/bin/initdb"),
        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)],
    )
    if not found:
        pytest.fail(
            f"PostgreSQL server binaries not found ({LIB}/*/bin/initdb): "
            "run scripts/system_deps.sh, or deselect these tests with -m 'not postgres'",
            pytrace=False,
        )
    return found[-1].parent


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", USER, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], what: str, log: Path | None = None) -> None:
    res = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        said = log.read_text(errors="replace") if log and log.exists() else ""
        output = f"{res.stdout}{res.stderr}{said}"
        pytest.fail(f"PostgreSQL {what} failed ({res.returncode}):\n{output}", pytrace=False)


def create_database(url: str, name: str) -> str:
    """A new empty database on the server of `url`; returns its URL."""
    base, _, _ = url.rpartition("/")
    dsn = base.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    import psycopg  # the postgres extra: a base install runs the fast tests without it

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    bin_dir = _bin_dir()
    base = Path(tempfile.mkdtemp(prefix="trainguard-pg-"))
    data, sockets, log = base / "data", base / "sockets", base / "server.log"
    sockets.mkdir()
    if os.geteuid() == 0:
        user = pwd.getpwnam(USER)
        for path in (base, sockets):
            os.chown(path, user.pw_uid, user.pw_gid)
    port = free_port()
    pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(data)]
    started = False
    try:
        initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "-A", "trust"]
        _run([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"], "initdb")
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        started = True  # from here on a half-started server must be stopped too
        _run([*pg_ctl, "-l", str(log), "-w", "-t", "30", "-o", options, "start"], "start", log)
        url = create_database(
            f"postgresql+psycopg://{USER}@127.0.0.1:{port}/postgres", "trainguard"
        )
        yield url
    finally:
        if started:
            subprocess.run(
                _as_server_user([*pg_ctl, "-m", "immediate", "-w", "stop"]),
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(base, ignore_errors=True)
