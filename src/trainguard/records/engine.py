"""The store's engine: SQLite (WAL, busy timeout) by default or PostgreSQL by URL, the
schema lock, connection pools that do not cross a fork, and one-line errors."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from trainguard.storage.private import private_file


def default_home() -> Path:
    return Path(os.environ.get("TRAINGUARD_HOME", ".trainguard")).resolve()


def private_sqlite(url: str) -> None:
    """Make a SQLite database file private before SQLite makes it (its WAL and SHM files
    take the database's mode); tighten those of a store made before."""
    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or not name or name.startswith((":memory:", "file:")):
        return  # in memory, or a URI filename whose options are SQLite's to read
    db = Path(name)
    private_file(db)
    for beside in (db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if beside.exists():
            private_file(beside)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


CONNECT_TIMEOUT_S = 10
"""How long reaching a database server may take: a command must not hang on a dead host."""

SCHEMA_LOCK = 0x7472_6169_6E67_7561  # "traingua": the advisory lock that schema creation holds


def engine_for(url: str) -> Engine:
    """SQLite with its pragmas; a server database with a connect timeout, and pooled
    connections checked before use (the server may have restarted) and never shared
    with a forked child."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(parsed)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {}
    if (
        parsed.get_driver_name() in ("psycopg", "psycopg2")
        and "connect_timeout" not in parsed.query
    ):
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
    engine = create_engine(parsed, pool_pre_ping=True, connect_args=connect_args)
    if parsed.get_backend_name() == "postgresql":
        event.listen(engine, "before_cursor_execute", no_nul, retval=True)
    _SERVER_ENGINES.add(engine)
    return engine


_SERVER_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_pools_in_child() -> None:
    """A forked child (a master the server starts) opens its own connections: two processes
    on one socket would garble each other's conversation with the server."""
    for engine in list(_SERVER_ENGINES):
        engine.dispose(close=False)  # the parent's connections stay open, for the parent


os.register_at_fork(after_in_child=_forget_pools_in_child)


def no_nul(
    _conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, many: bool
) -> tuple[str, Any]:
    """PostgreSQL text cannot hold NUL, which a replica's output may: it becomes U+FFFD."""

    def clean(row: Any) -> Any:
        if not isinstance(row, dict):
            return row
        return {k: v.replace("\x00", "\ufffd") if isinstance(v, str) else v for k, v in row.items()}

    return statement, [clean(r) for r in params] if many else clean(params)


def one_line(exc: BaseException) -> str:
    """The driver's own words on one line, without SQLAlchemy's echo of the statement."""
    return " ".join(str(getattr(exc, "orig", None) or exc).split())


def shown(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url
