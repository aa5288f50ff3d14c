"""Turns what the master emits (transitions, attempts, runs, restarts) into store rows."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func

from trainguard.classify.classes import Classification
from trainguard.classify.readings import to_json
from trainguard.errors import StoreError
from trainguard.hangs.diagnose import Diagnosis
from trainguard.notify.notifier import Notifier
from trainguard.policy.budgets import Failure
from trainguard.records.schema import (
    CUSTOM_MESSAGE_EVENT,
    KEPT_CUSTOM_MESSAGES,
    attempts,
    failure_records,
    jobs,
    progress,
    replica_runs,
    restart_records,
    stack_snapshots,
)
from trainguard.records.store import Store, spec_json
from trainguard.states import JobState, ReplicaState

NODE = socket.gethostname()

RETRY_S = 2.0
"""How often held writes are tried again while the store refuses them."""
DRAIN_S = 600.0
"""How long a master that has finished waits for its store to take what is held."""


class Recorder:
    """Writes the rows, and tells the notifier (if any) what people may want to hear."""

    def __init__(self, store: Store, job_id: str, notifier: Notifier | None = None) -> None:
        self.store = store
        self.job_id = job_id
        self.notifier = notifier
        # Writes the store refused for now (locked, disk full), in order, with the
        # placeholder id each insert handed out; written when the store takes them again.
        self._backlog: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], int]] = []
        self._ids: dict[int, int] = {}  # placeholder -> the row's real id
        self._next_placeholder = -1
        self._ends: list[tuple[int, dict[str, Any]]] | None = None  # run ends held (`ending`)
        self._retry_at = 0.0
        self.say: Callable[[str], None] = lambda text: print(f"trainguard: {text}", file=sys.stderr)

    # ------------------------------------------------------------ writes that wait

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Write now, or hold the write in memory while the store is locked or full.

        The master never stops (or restarts a finished job) because its store is busy:
        a held insert returns a placeholder id that later writes may use.
        """
        if self._backlog and not self.flush():
            return self._defer(fn, args, kwargs)
        try:
            return fn(*self._resolve(args), **kwargs)
        except StoreError as exc:
            if not exc.transient:
                raise
            self._retry_at = time.monotonic() + RETRY_S
            self.say(
                f"the store refused a write ({exc}); holding writes in memory "
                f"and retrying every {RETRY_S:g} s"
            )
            return self._defer(fn, args, kwargs)

    def _insert(self, table: Any, **values: Any) -> int:
        """A row's id, or the placeholder of an insert held for later."""
        return int(self._write(self.store.insert, table, **values))

    def _defer(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        placeholder = self._next_placeholder
        self._next_placeholder -= 1
        self._backlog.append((fn, args, kwargs, placeholder))
        return placeholder

    def _resolve(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """Positional ints below 0 are the placeholders of held inserts (ids are > 0)."""
        return tuple(self._ids.get(a, a) if type(a) is int and a < 0 else a for a in args)

    def flush(self, force: bool = False) -> bool:
        """Write what is held, in order; True when nothing is held any more."""
        if not self._backlog:
            return True
        if not force and time.monotonic() < self._retry_at:
            return False
        while self._backlog:
            fn, args, kwargs, placeholder = self._backlog[0]
            try:
                result = fn(*self._resolve(args), **kwargs)
            except StoreError as exc:
                if exc.transient:
                    self._retry_at = time.monotonic() + RETRY_S
                    return False
                self.say(f"a held write was refused for good ({exc}); dropped")
                result = None
            self._backlog.pop(0)
            if type(result) is int:
                self._ids[placeholder] = result
        self.say("the store takes writes again; every held write is recorded")
        return True

    @property
    def held(self) -> int:
        """How many writes wait for the store."""
        return len(self._backlog)

    async def drain(self, timeout_s: float = DRAIN_S) -> bool:
        """At the job's end: keep trying until what is held is written (or time is up)."""
        deadline = time.monotonic() + timeout_s
        while not self.flush(force=True):
            if time.monotonic() >= deadline:
                self.say(
                    f"{self.held} writes could not be recorded: the store stayed locked or full"
                )
                return False
            await asyncio.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
        return True

    def _notify(self, kind: str, text: str, **fields: Any) -> None:
        if self.notifier is not None:
            self.notifier.emit(kind, text, **fields)

    def job_created(
        self, *, name: str, spec: Any, log_dir: Path, at_s: float, master: dict[str, Any]
    ) -> None:
        self.store.insert(
            jobs,
            id=self.job_id,
            name=name,
            spec_json=spec_json(spec),
            state=JobState.PENDING.value,
            created_at_s=at_s,
            attempts=0,
            log_dir=str(log_dir),
            **master,
        )
        self.store.record_transition(self.job_id, None, JobState.PENDING, at_s, "created")

    def job_resumed(self, prev: JobState, at_s: float, master: dict[str, Any]) -> None:
        """The same job again, under a new master: records and logs go on where they were."""
        self.store.record_transition(
            self.job_id,
            prev,
            JobState.PENDING,
            at_s,
            "resumed",
            ended_at_s=None,
            error_code=None,
            error_message=None,
            **master,
        )

    def transition(
        self, prev: JobState, state: JobState, at_s: float, reason: str, **job_values: Any
    ) -> None:
        if state.is_terminal:
            job_values.setdefault("ended_at_s", at_s)
        self._write(
            self.store.record_transition, self.job_id, prev, state, at_s, reason, **job_values
        )
        self._notify(
            "state_change",
            f"{prev.value} -> {state.value}: {reason}",
            state=state.value,
            previous=prev.value,
            error_code=job_values.get("error_code"),
        )

    def queued(self, reason: str | None) -> None:
        """Why the job waits (None: it no longer does)."""
        self._write(self.store.update_job, self.job_id, queued_reason=reason)

    def attempt_started(self, number: int, at_s: float, addr: str, port: int) -> None:
        self._insert(
            attempts,
            job_id=self.job_id,
            number=number,
            started_at_s=at_s,
            master_addr=addr,
            master_port=port,
        )
        self._write(self.store.update_job, self.job_id, attempts=number + 1)

    def attempt_ended(self, number: int, at_s: float, outcome: str, reason: str) -> None:
        self._write(
            self.store.end_attempt,
            self.job_id,
            number,
            ended_at_s=at_s,
            outcome=outcome,
            reason=reason,
        )

    def run_started(
        self,
        *,
        attempt: int,
        replica: str,
        rank: int,
        restart: int,
        pid: int | None,
        log_path: Path,
        at_s: float,
        node: str | None = None,
    ) -> int:
        return self._insert(
            replica_runs,
            job_id=self.job_id,
            attempt=attempt,
            replica=replica,
            rank=rank,
            restart=restart,
            pid=pid,
            node=node or NODE,
            state=ReplicaState.RUNNING.value,
            started_at_s=at_s,
            log_path=str(log_path),
        )

    def run_ended(
        self,
        run_id: int,
        at_s: float,
        c: Classification,
        state: ReplicaState,
        tail: tuple[str, ...] = (),
    ) -> None:
        values = {
            "state": state.value,
            "exit_code": c.exit_code,
            "signal": c.signal,
            "failure_class": c.failure_class.value if c.failure_class else None,
            "rule": c.rule,
            "message": c.message or None,
            "stop_requested": c.kind == "stop_requested",
            "ended_at_s": at_s,
            "fingerprint": c.fingerprint,
            "tail": "\n".join(tail) if tail else None,
        }
        if self._ends is not None:
            self._ends.append((run_id, values))
        else:
            self._write(self.store.update_row, replica_runs, run_id, **values)

    @contextmanager
    def ending(self) -> Iterator[None]:
        """The runs ended inside are written together at its end, in one transaction (a
        stop of 1,024 replicas: 0.5 s of one transaction each, which held the restart).
        Where a write is already held (the store busy), each goes its own way, in order."""
        if self._ends is not None:  # inside one already
            yield
            return
        self._ends = []
        try:
            yield
        finally:
            ends, self._ends = self._ends, None
            if self._backlog or any(run_id < 0 for run_id, _ in ends):
                for run_id, values in ends:
                    self._write(self.store.update_row, replica_runs, run_id, **values)
            elif ends:
                self._write(self.store.update_rows, replica_runs, ends)

    def failure(
        self,
        f: Failure,
        *,
        root_cause: bool,
        decision: str,
        cascade_of: str | None = None,
    ) -> None:
        c = f.classification
        self._insert(
            failure_records,
            job_id=self.job_id,
            attempt=f.attempt,
            replica=f.replica,
            at_s=f.time_s,
            exit_code=c.exit_code,
            signal=c.signal,
            failure_class=c.failure_class.value if c.failure_class else None,
            retryable=c.retryable,
            rule=c.rule,
            matched_line=c.matched_line,
            fingerprint=c.fingerprint,
            message=c.message,
            root_cause=root_cause,
            cascade_of=cascade_of,
            decision=decision,
            confidence=c.confidence,
            phase=c.phase,
            step=f.progress,
            notes="\n".join(c.notes) or None,
            machine=to_json(c.readings),
        )

    def diagnosis(self, diag: Diagnosis, attempt: int, at_s: float, kind: str) -> int:
        """Store a hang's stack dumps (for `trainguard stacks`); returns its id (the row's in
        `stack_snapshots`: the table keeps its name, stores made before keep working)."""
        return self._stack_dumps(
            attempt=attempt,
            at_s=at_s,
            kind=kind,
            culprits=list(diag.report.culprits),
            summary=diag.report.summary,
            duration_ms=diag.duration_ms,
            report=diag.report.to_dict(),
            snapshots=[s.to_dict() for s in diag.stacks],
        )

    def _stack_dumps(
        self,
        *,
        attempt: int,
        at_s: float,
        kind: str,
        culprits: list[str],
        summary: str,
        duration_ms: float,
        report: dict[str, Any],
        snapshots: list[dict[str, Any]],
    ) -> int:
        self._notify("hang", summary, kind_of_hang=kind, culprits=culprits, attempt=attempt)
        return self._insert(
            stack_snapshots,
            job_id=self.job_id,
            attempt=attempt,
            at_s=at_s,
            kind=kind,
            culprits=", ".join(culprits) or None,
            summary=summary,
            duration_ms=duration_ms,
            report_json=json.dumps(report),
            snapshots_json=json.dumps(snapshots),
        )

    def progress(self, at_s: float, step: int | None, metrics: dict[str, object]) -> None:
        self._write(
            self.store.update_job,
            self.job_id,
            last_step=step,
            last_metrics_json=json.dumps(metrics, sort_keys=True),
            last_progress_s=at_s,
        )

    def step(
        self, attempt: int, step: int, at_s: float, checkpoint: str | None, commit_ms: float | None
    ) -> None:
        self._insert(
            progress,
            job_id=self.job_id,
            attempt=attempt,
            step=step,
            at_s=at_s,
            checkpoint=checkpoint,
            commit_ms=commit_ms,
        )

    def event(self, at_s: float, replica: str | None, kind: str, text: str) -> None:
        keep = KEPT_CUSTOM_MESSAGES if kind == CUSTOM_MESSAGE_EVENT else None
        self._write(self.store.insert_event, self.job_id, at_s, replica, kind, text, keep=keep)
        if kind == CUSTOM_MESSAGE_EVENT:
            self._notify("custom_message", text, replica=replica)

    def restart(self, **values: Any) -> int:
        values["node"] = values.get("node") or NODE  # a failure elsewhere names its node
        row = self._insert(restart_records, job_id=self.job_id, **values)
        about = {k: values.get(k) for k in ("replica", "failure_class", "error_code", "round")}
        text = f"{values.get('error_message')} -> {values.get('decision')}"
        self._notify("restart", text, **about)
        if values.get("isolated"):
            self._notify("isolation", str(values["isolated"]), replica=values.get("replica"))
        return row

    def restart_phases(self, record_id: int, **phases_ms: float) -> None:
        self._write(self.store.update_row, restart_records, record_id, **phases_ms)

    def restart_note(self, record_id: int, note: str) -> None:
        """Add to what a restart took out of the next attempt (a node check's finding)."""
        isolated = func.coalesce(restart_records.c.isolated + "; ", "") + note
        self._write(self.store.update_row, restart_records, record_id, isolated=isolated)
