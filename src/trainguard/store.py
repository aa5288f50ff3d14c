"""The durable record (R-REC-1, R-RUN-1): SQLAlchemy Core over SQLite (WAL) by default.

A job row is separate from its attempts, attempts from their replicas' runs. Times are
seconds since the epoch and say so in their names; a null end time means still running.
"""

from __future__ import annotations

import fcntl
import json
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError

from trainguard.errors import JobNotFound, StoreError

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(128), nullable=False, index=True),
    Column("spec_json", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at_s", Float, nullable=False),
    Column("ended_at_s", Float),
    Column("attempts", Integer, nullable=False, default=0),
    Column("error_code", String(32)),
    Column("error_message", Text),
    Column("master_pid", Integer),
    Column("master_host", String(255)),
    # /proc start time: tells a reused pid apart (ticks since boot pass 2**31 in 248 days)
    Column("master_started_ticks", BigInteger),
    Column("log_dir", Text, nullable=False),
    Column("cwd", Text),  # where its replicas run, for `trainguard resume`
    Column("last_step", BigInteger),  # progress, from sdk.report
    Column("last_metrics_json", Text),
    Column("last_progress_s", Float),
    # Server jobs (`trainguard submit`): who owns the job, and where it stands in the queue.
    Column("origin", String(16)),  # "server" for a submitted job; null for `trainguard run`
    Column("priority", Integer),
    Column("queued_reason", Text),
    Column("queued_at_s", Float),  # when it (last) entered the queue: FIFO order and max wait
)

attempts = Table(
    "attempts",
    metadata,
    Column("job_id", ForeignKey("jobs.id"), primary_key=True),
    Column("number", Integer, primary_key=True),
    Column("started_at_s", Float, nullable=False),
    Column("ended_at_s", Float),
    Column("master_addr", String(255)),
    Column("master_port", Integer),
    Column("outcome", String(32)),
    Column("reason", Text),
)

replica_runs = Table(
    "replica_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("replica", String(64), nullable=False),
    Column("rank", Integer, nullable=False),
    Column("restart", Integer, nullable=False, default=0),  # replica restarts within the attempt
    Column("pid", Integer),
    Column("node", String(255)),
    Column("state", String(16), nullable=False),
    Column("exit_code", Integer),
    Column("signal", String(16)),
    Column("failure_class", String(32)),
    Column("rule", String(64)),
    Column("message", Text),
    Column("stop_requested", Boolean, nullable=False, default=False),
    Column("started_at_s", Float, nullable=False),
    Column("ended_at_s", Float),
    Column("log_path", Text),
    Column("fingerprint", String(16)),
    Column("tail", Text),  # the last lines it printed: what classification read
)

transitions = Table(
    "transitions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("from_state", String(16)),
    Column("to_state", String(16), nullable=False),
    Column("at_s", Float, nullable=False),
    Column("reason", Text),
)

restart_records = Table(
    "restart_records",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("round", Integer, nullable=False),
    Column("at_s", Float, nullable=False),
    Column("node", String(255)),
    Column("replica", String(64)),
    Column("error_code", String(32)),
    Column("error_message", Text),
    Column("error_source", String(32)),
    Column("failure_class", String(32)),
    Column("rule", String(64)),
    Column("decision", Text),
    Column("detect_ms", Float),
    Column("stop_ms", Float),
    Column("schedule_ms", Float),
    Column("start_ms", Float),
    Column("first_output_ms", Float),
    Column("fingerprint", String(16)),
    Column("matched_line", Text),
    Column("cascade", Text),  # the replicas whose failures followed this one
    Column("snapshot_id", Integer),  # the stack snapshot taken before a hang was killed
    Column("isolated", Text),  # what this failure took out of the next attempt, and why
)

# The stacks of every replica, taken before a hung job is stopped (`trainguard stacks`).
stack_snapshots = Table(
    "stack_snapshots",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("at_s", Float, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("culprits", Text),
    Column("summary", Text),
    Column("duration_ms", Float),
    Column("report_json", Text, nullable=False),
    Column("snapshots_json", Text, nullable=False),
)

# The job's progress over time: one row when a reported step passes the attempt's best.
progress = Table(
    "progress",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("at_s", Float, nullable=False),
    Column("checkpoint", String(32)),  # a checkpoint committed at this step, if any
    Column("commit_ms", Float),
)

# What training code said (send_custom_message) and other notable moments of a job.
events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("at_s", Float, nullable=False),
    Column("replica", String(128)),  # as named by the SDK (sdk_server.MAX_REPLICA_CHARS)
    Column("kind", String(32), nullable=False),
    Column("text", Text),
)

# Every classified failure, root causes and their cascades alike (`trainguard explain`).
failure_records = Table(
    "failure_records",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", ForeignKey("jobs.id"), nullable=False, index=True),
    Column("attempt", Integer, nullable=False),
    Column("replica", String(64), nullable=False),
    Column("at_s", Float, nullable=False),
    Column("exit_code", Integer),
    Column("signal", String(16)),
    Column("failure_class", String(32)),
    Column("retryable", Boolean),
    Column("rule", String(64)),
    Column("matched_line", Text),
    Column("fingerprint", String(16)),
    Column("message", Text),
    Column("root_cause", Boolean, nullable=False),
    Column("cascade_of", String(64)),  # the root cause's replica, for a cascade
    Column("decision", Text),
    Column("confidence", Float),  # how sure the evidence made the class
    Column("phase", String(16)),  # start-up, training or unknown
    Column("step", BigInteger),  # the progress point: the step the replica had reached
    Column("notes", Text),  # what the context changed, one per line
)


def default_home() -> Path:
    return Path(os.environ.get("TRAINGUARD_HOME", ".trainguard")).resolve()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


CONNECT_TIMEOUT_S = 10
"""How long reaching a database server may take: a command must not hang on a dead host."""

_SCHEMA_LOCK = 0x7472_6169_6E67_7561  # "traingua": the advisory lock that schema creation holds


def _engine(url: str) -> Engine:
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
        event.listen(engine, "before_cursor_execute", _no_nul, retval=True)
    _SERVER_ENGINES.add(engine)
    return engine


_SERVER_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


def _forget_pools_in_child() -> None:
    """A forked child (a master the server starts) opens its own connections: two processes
    on one socket would garble each other's conversation with the server."""
    for engine in list(_SERVER_ENGINES):
        engine.dispose(close=False)  # the parent's connections stay open, for the parent


os.register_at_fork(after_in_child=_forget_pools_in_child)


def _no_nul(
    _conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, many: bool
) -> tuple[str, Any]:
    """PostgreSQL text cannot hold NUL, which a replica's output may: it becomes U+FFFD."""

    def clean(row: Any) -> Any:
        if not isinstance(row, dict):
            return row
        return {k: v.replace("\x00", "\ufffd") if isinstance(v, str) else v for k, v in row.items()}

    return statement, [clean(r) for r in params] if many else clean(params)


def _one_line(exc: BaseException) -> str:
    """The driver's own words on one line, without SQLAlchemy's echo of the statement."""
    return " ".join(str(getattr(exc, "orig", None) or exc).split())


def _shown(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


class Store:
    """Rows in, rows out. Every method is one short transaction."""

    def __init__(self, home: Path | None = None, url: str | None = None) -> None:
        self.home = home or default_home()
        try:
            if url is None:
                self.home.mkdir(parents=True, exist_ok=True)
                url = f"sqlite:///{self.home / 'trainguard.db'}"
            self.engine: Engine = _engine(url)
            if self.engine.dialect.name == "sqlite":
                # Two commands opening a new store at once must not both create tables.
                self.home.mkdir(parents=True, exist_ok=True)  # holds the lock, whatever the URL
                with open(self.home / "trainguard.lock", "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    self._create_schema()
            else:
                self._create_schema()
        except (OSError, ImportError, SQLAlchemyError) as exc:  # ImportError: no driver
            where = _shown(url) if url else self.home
            raise StoreError(
                f"cannot open the trainguard store at {where}: {_one_line(exc)}"
            ) from None

    def _create_schema(self) -> None:
        """Create missing tables, and add columns that a newer trainguard defines (all nullable)."""
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Two commands opening a new store at once must not both create tables. The
                # lock lasts until this transaction ends; PostgreSQL's DDL is transactional.
                conn.execute(select(func.pg_advisory_xact_lock(_SCHEMA_LOCK)))
            metadata.create_all(conn)
            found = inspect(conn)
            for table in metadata.sorted_tables:
                have = {c["name"] for c in found.get_columns(table.name)}
                for col in table.columns:
                    if col.name not in have:
                        kind = col.type.compile(dialect=self.engine.dialect)
                        conn.execute(
                            text(f'ALTER TABLE {table.name} ADD COLUMN "{col.name}" {kind}')
                        )

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            kind = type(getattr(exc, "orig", None) or exc).__name__
            raise StoreError(
                f"trainguard store error: {kind}: {_one_line(exc)}",
                transient=isinstance(exc, OperationalError),
            ) from None

    def close(self) -> None:
        self.engine.dispose()

    # -------------------------------------------------------------- writes

    def insert(self, table: Table, **values: Any) -> int:
        with self._tx() as conn:
            res = conn.execute(insert(table).values(**values))
            key = res.inserted_primary_key
            return int(key[0]) if key and isinstance(key[0], int) else 0

    def update_job(self, job_id: str, **values: Any) -> None:
        with self._tx() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))

    def update_row(self, table: Table, row_id: int, **values: Any) -> None:
        with self._tx() as conn:
            conn.execute(update(table).where(table.c.id == row_id).values(**values))

    def end_attempt(self, job_id: str, number: int, **values: Any) -> None:
        with self._tx() as conn:
            conn.execute(
                update(attempts)
                .where(attempts.c.job_id == job_id, attempts.c.number == number)
                .values(**values)
            )

    def record_transition(
        self,
        job_id: str,
        prev: str | None,
        state: str,
        at_s: float,
        reason: str | None,
        **job_values: Any,
    ) -> None:
        with self._tx() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(state=state, **job_values))
            conn.execute(
                insert(transitions).values(
                    job_id=job_id, from_state=prev, to_state=state, at_s=at_s, reason=reason
                )
            )

    def set_state_if(
        self,
        job_id: str,
        expected: str,
        state: str,
        at_s: float,
        reason: str | None = None,
        **values: Any,
    ) -> bool:
        """Move a job from `expected` to `state` unless someone else moved it first."""
        with self._tx() as conn:
            res = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == expected)
                .values(state=state, **values)
            )
            if res.rowcount != 1:
                return False
            conn.execute(
                insert(transitions).values(
                    job_id=job_id,
                    from_state=expected,
                    to_state=state,
                    at_s=at_s,
                    reason=reason or values.get("error_message"),
                )
            )
            return True

    def close_open_rows(self, job_id: str, at_s: float, outcome: str) -> None:
        """End the attempts and runs of a job whose master vanished mid-way."""
        with self._tx() as conn:
            conn.execute(
                update(attempts)
                .where(attempts.c.job_id == job_id, attempts.c.ended_at_s.is_(None))
                .values(ended_at_s=at_s, outcome=outcome)
            )
            conn.execute(
                update(replica_runs)
                .where(replica_runs.c.job_id == job_id, replica_runs.c.ended_at_s.is_(None))
                .values(ended_at_s=at_s, state="STOPPED", message=f"master lost ({outcome})")
            )

    # -------------------------------------------------------------- reads

    def _rows(self, stmt: Any) -> list[dict[str, Any]]:
        with self._tx() as conn:
            return [dict(r._mapping) for r in conn.execute(stmt)]

    def list_jobs(self, limit: int = 50) -> list[dict[str, Any]]:
        return self._rows(select(jobs).order_by(jobs.c.created_at_s.desc()).limit(limit))

    def live_jobs(self) -> list[dict[str, Any]]:
        from trainguard.states import JobState

        live = [s.value for s in JobState if not s.is_terminal]
        return self._rows(select(jobs).where(jobs.c.state.in_(live)))

    def jobs_in(self, states: list[str], origin: str | None = None) -> list[dict[str, Any]]:
        """Jobs in these states (of one origin, e.g. the server's), oldest first."""
        stmt = select(jobs).where(jobs.c.state.in_(states))
        if origin is not None:
            stmt = stmt.where(jobs.c.origin == origin)
        return self._rows(stmt.order_by(jobs.c.created_at_s))

    def count_transitions(self, job_id: str, reason: str) -> int:
        return len(
            self._rows(
                select(transitions.c.id).where(
                    transitions.c.job_id == job_id, transitions.c.reason == reason
                )
            )
        )

    def resolve_job(self, ref: str) -> dict[str, Any]:
        """A job by id, or by name (the most recent job of that name)."""
        rows = self._rows(select(jobs).where(jobs.c.id == ref))
        if not rows:
            rows = self._rows(
                select(jobs).where(jobs.c.name == ref).order_by(jobs.c.created_at_s.desc()).limit(1)
            )
        if not rows:
            raise JobNotFound(f"no job with id or name {ref!r} in {self.home}")
        return rows[0]

    def job(self, job_id: str) -> dict[str, Any]:
        return self.resolve_job(job_id)

    def attempts_of(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(
            select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.number)
        )

    def runs_of(self, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        stmt = select(replica_runs).where(replica_runs.c.job_id == job_id)
        if attempt is not None:
            stmt = stmt.where(replica_runs.c.attempt == attempt)
        return self._rows(
            stmt.order_by(replica_runs.c.attempt, replica_runs.c.rank, replica_runs.c.id)
        )

    def transitions_of(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(
            select(transitions).where(transitions.c.job_id == job_id).order_by(transitions.c.id)
        )

    def failures_of(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(
            select(failure_records)
            .where(failure_records.c.job_id == job_id)
            .order_by(failure_records.c.id)
        )

    def snapshots_of(self, job_id: str, attempt: int | None = None) -> list[dict[str, Any]]:
        stmt = select(stack_snapshots).where(stack_snapshots.c.job_id == job_id)
        if attempt is not None:
            stmt = stmt.where(stack_snapshots.c.attempt == attempt)
        return self._rows(stmt.order_by(stack_snapshots.c.id))

    def progress_of(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(
            select(progress).where(progress.c.job_id == job_id).order_by(progress.c.id)
        )

    def events_of(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(select(events).where(events.c.job_id == job_id).order_by(events.c.id))

    def restarts_of(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(
            select(restart_records)
            .where(restart_records.c.job_id == job_id)
            .order_by(restart_records.c.id)
        )


def spec_json(spec: Any) -> str:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True)
