"""The durable record (R-REC-1, R-RUN-1): SQLAlchemy Core over SQLite (WAL) by default.

A job row is separate from its attempts, attempts from their replicas' runs. Times are
seconds since the epoch and say so in their names; a null end time means still running.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    bindparam,
    delete,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from trainguard.errors import JobNotFound, StoreError
from trainguard.records.engine import (
    SCHEMA_LOCK,
    default_home,
    engine_for,
    one_line,
    private_sqlite,
    shown,
)
from trainguard.records.rows import (
    AttemptRow,
    EventRow,
    FailureRow,
    JobRow,
    ProgressRow,
    RestartRow,
    RunRow,
    StackDumpRow,
    TransitionRow,
    _Row,
)
from trainguard.records.schema import (
    attempts,
    events,
    failure_records,
    jobs,
    metadata,
    progress,
    replica_runs,
    restart_records,
    stack_snapshots,
    transitions,
)
from trainguard.states import JobState
from trainguard.storage.private import PRIVATE_DIR, private_dir, private_file, tighten

R = TypeVar("R", bound=_Row)


class Store:
    """Rows in, rows out. Every method is one short transaction."""

    def __init__(self, home: Path | None = None, url: str | None = None) -> None:
        self.home = home or default_home()
        try:
            if url is None:
                self.home.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)
                url = f"sqlite:///{self.home / 'trainguard.db'}"
            self.engine: Engine = engine_for(url)
            if self.engine.dialect.name == "sqlite":
                # Two commands opening a new store at once must not both create tables.
                self.home.mkdir(PRIVATE_DIR, parents=True, exist_ok=True)  # the lock, the logs
                tighten(private_dir(self.home / "jobs"))  # a store made before too
                with open(private_file(self.home / "trainguard.lock"), "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    private_sqlite(url)
                    self._create_schema()
            else:
                self._create_schema()
        except (OSError, ImportError, SQLAlchemyError) as exc:  # ImportError: no driver
            where = shown(url) if url else self.home
            raise StoreError(
                f"cannot open the trainguard store at {where}: {one_line(exc)}"
            ) from None

    def _create_schema(self) -> None:
        """Create missing tables, and add columns that a newer trainguard defines (all nullable)."""
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Two commands opening a new store at once must not both create tables. The
                # lock lasts until this transaction ends; PostgreSQL's DDL is transactional.
                conn.execute(select(func.pg_advisory_xact_lock(SCHEMA_LOCK)))
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
                f"trainguard store error: {kind}: {one_line(exc)}",
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

    def update_rows(self, table: Table, rows: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        """Many rows' updates in one transaction, one statement per set of columns (the
        runs a stop of a thousand replicas ends: a transaction each cost 0.5 ms)."""
        groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for row_id, values in rows:
            params = {"row_id_": row_id, **{f"{k}_": v for k, v in values.items()}}
            groups.setdefault(tuple(sorted(values)), []).append(params)
        with self._tx() as conn:
            for keys, params_list in groups.items():
                where = table.c.id == bindparam("row_id_")
                stmt = update(table).where(where).values({k: bindparam(f"{k}_") for k in keys})
                conn.execute(stmt, params_list)

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

    def hold_cancel(self, job_id: str, at_s: float) -> bool:
        """Keep a cancel for a live job whose master is not up yet; False if it is up by now
        (or the job is over): then the master itself must be asked."""
        live = [s.value for s in JobState if not s.is_terminal]
        with self._tx() as conn:
            res = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.master_pid.is_(None), jobs.c.state.in_(live))
                .values(cancel_requested_at_s=at_s)
            )
            return res.rowcount == 1

    def claim_master(self, job_id: str, identity: dict[str, Any]) -> JobRow | None:
        """Write the master's identity into an admitted (PENDING) job, in the transaction that
        reads what was held for it (a cancel); None if the job is not PENDING any more."""
        with self._tx() as conn:
            res = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == JobState.PENDING.value)
                .values(**identity)
            )
            if res.rowcount != 1:
                return None
            return JobRow.of(conn.execute(select(jobs).where(jobs.c.id == job_id)).one()._mapping)

    def insert_event(
        self,
        job_id: str,
        at_s: float,
        replica: str | None,
        kind: str,
        text: str,
        keep: int | None = None,
    ) -> int:
        """Add an event; with `keep`, only the newest `keep` of its kind stay (one
        transaction: a reader never sees more)."""
        with self._tx() as conn:
            res = conn.execute(
                insert(events).values(
                    job_id=job_id, at_s=at_s, replica=replica, kind=kind, text=text
                )
            )
            if keep is not None:
                oldest_kept = (
                    select(events.c.id)
                    .where(events.c.job_id == job_id, events.c.kind == kind)
                    .order_by(events.c.id.desc())
                    .limit(1)
                    .offset(keep - 1)
                    .scalar_subquery()
                )
                conn.execute(
                    delete(events).where(
                        events.c.job_id == job_id, events.c.kind == kind, events.c.id < oldest_kept
                    )
                )
            key = res.inserted_primary_key
            return int(key[0]) if key and isinstance(key[0], int) else 0

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

    def _typed(self, row: type[R], stmt: Any) -> list[R]:
        with self._tx() as conn:
            return [row.of(r._mapping) for r in conn.execute(stmt)]

    def _jobs(self, stmt: Any) -> list[JobRow]:
        return self._typed(JobRow, stmt)

    def list_jobs(self, limit: int = 50) -> list[JobRow]:
        return self._jobs(select(jobs).order_by(jobs.c.created_at_s.desc()).limit(limit))

    def live_jobs(self) -> list[JobRow]:
        live = [s.value for s in JobState if not s.is_terminal]
        return self._jobs(select(jobs).where(jobs.c.state.in_(live)))

    def jobs_in(self, states: list[str], origin: str | None = None) -> list[JobRow]:
        """Jobs in these states (of one origin, e.g. the server's), oldest first."""
        stmt = select(jobs).where(jobs.c.state.in_(states))
        if origin is not None:
            stmt = stmt.where(jobs.c.origin == origin)
        return self._jobs(stmt.order_by(jobs.c.created_at_s))

    def count_transitions(self, job_id: str, reason: str) -> int:
        return len(
            self._rows(
                select(transitions.c.id).where(
                    transitions.c.job_id == job_id, transitions.c.reason == reason
                )
            )
        )

    def resolve_job(self, ref: str) -> JobRow:
        """A job by id, or by name (the most recent job of that name)."""
        rows = self._jobs(select(jobs).where(jobs.c.id == ref))
        if not rows:
            rows = self._jobs(
                select(jobs).where(jobs.c.name == ref).order_by(jobs.c.created_at_s.desc()).limit(1)
            )
        if not rows:
            raise JobNotFound(f"no job with id or name {ref!r} in {self.home}")
        return rows[0]

    def job(self, job_id: str) -> JobRow:
        return self.resolve_job(job_id)

    def attempts_of(self, job_id: str) -> list[AttemptRow]:
        return self._typed(
            AttemptRow,
            select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.number),
        )

    def runs_of(self, job_id: str, attempt: int | None = None) -> list[RunRow]:
        stmt = select(replica_runs).where(replica_runs.c.job_id == job_id)
        if attempt is not None:
            stmt = stmt.where(replica_runs.c.attempt == attempt)
        return self._typed(
            RunRow, stmt.order_by(replica_runs.c.attempt, replica_runs.c.rank, replica_runs.c.id)
        )

    def transitions_of(self, job_id: str) -> list[TransitionRow]:
        return self._typed(
            TransitionRow,
            select(transitions).where(transitions.c.job_id == job_id).order_by(transitions.c.id),
        )

    def failures_of(self, job_id: str) -> list[FailureRow]:
        return self._typed(
            FailureRow,
            select(failure_records)
            .where(failure_records.c.job_id == job_id)
            .order_by(failure_records.c.id),
        )

    def stack_dumps_of(self, job_id: str, attempt: int | None = None) -> list[StackDumpRow]:
        stmt = select(stack_snapshots).where(stack_snapshots.c.job_id == job_id)
        if attempt is not None:
            stmt = stmt.where(stack_snapshots.c.attempt == attempt)
        return self._typed(StackDumpRow, stmt.order_by(stack_snapshots.c.id))

    def progress_of(self, job_id: str, last: int | None = None) -> list[ProgressRow]:
        """A job's progress rows, oldest first (with `last`: only the newest `last`)."""
        stmt = select(progress).where(progress.c.job_id == job_id)
        if last is None:
            return self._typed(ProgressRow, stmt.order_by(progress.c.id))
        return self._typed(ProgressRow, stmt.order_by(progress.c.id.desc()).limit(last))[::-1]

    def events_of(self, job_id: str) -> list[EventRow]:
        return self._typed(
            EventRow, select(events).where(events.c.job_id == job_id).order_by(events.c.id)
        )

    def events_page(
        self, job_id: str, limit: int, after: int | None = None, before: int | None = None
    ) -> tuple[list[EventRow], bool]:
        """The newest `limit` events with ids in (after, before), oldest first, and whether
        older ones (in that range) were left out: a page to show, never every event."""
        stmt = select(events).where(events.c.job_id == job_id)
        if after is not None:
            stmt = stmt.where(events.c.id > after)
        if before is not None:
            stmt = stmt.where(events.c.id < before)
        rows = self._typed(EventRow, stmt.order_by(events.c.id.desc()).limit(limit + 1))
        return rows[:limit][::-1], len(rows) > limit

    def restarts_of(self, job_id: str) -> list[RestartRow]:
        return self._typed(
            RestartRow,
            select(restart_records)
            .where(restart_records.c.job_id == job_id)
            .order_by(restart_records.c.id),
        )


def spec_json(spec: Any) -> str:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True)
