"""Turns what the master emits (transitions, attempts, runs, restarts) into store rows."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from trainguard.classify import Classification
from trainguard.notify import Notifier
from trainguard.policy import Failure
from trainguard.states import JobState, ReplicaState
from trainguard.store import (
    Store,
    attempts,
    events,
    failure_records,
    jobs,
    progress,
    replica_runs,
    restart_records,
    spec_json,
    stack_snapshots,
)

NODE = socket.gethostname()


class Recorder:
    """Writes the rows, and tells the notifier (if any) what people may want to hear."""

    def __init__(self, store: Store, job_id: str, notifier: Notifier | None = None) -> None:
        self.store = store
        self.job_id = job_id
        self.notifier = notifier

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
        self.store.record_transition(self.job_id, prev, state, at_s, reason, **job_values)
        self._notify(
            "state_change",
            f"{prev.value} -> {state.value}: {reason}",
            state=state.value,
            previous=prev.value,
            error_code=job_values.get("error_code"),
        )

    def attempt_started(self, number: int, at_s: float, addr: str, port: int) -> None:
        self.store.insert(
            attempts,
            job_id=self.job_id,
            number=number,
            started_at_s=at_s,
            master_addr=addr,
            master_port=port,
        )
        self.store.update_job(self.job_id, attempts=number + 1)

    def attempt_ended(self, number: int, at_s: float, outcome: str, reason: str) -> None:
        self.store.end_attempt(self.job_id, number, ended_at_s=at_s, outcome=outcome, reason=reason)

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
        return self.store.insert(
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
        self.store.update_row(
            replica_runs,
            run_id,
            state=state.value,
            exit_code=c.exit_code,
            signal=c.signal,
            failure_class=c.failure_class.value if c.failure_class else None,
            rule=c.rule,
            message=c.message or None,
            stop_requested=c.kind == "stop_requested",
            ended_at_s=at_s,
            fingerprint=c.fingerprint,
            tail="\n".join(tail) if tail else None,
        )

    def failure(
        self,
        f: Failure,
        *,
        root_cause: bool,
        decision: str,
        cascade_of: str | None = None,
    ) -> None:
        c = f.classification
        self.store.insert(
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
        )

    def snapshot(
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
        return self.store.insert(
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
        self.store.update_job(
            self.job_id,
            last_step=step,
            last_metrics_json=json.dumps(metrics, sort_keys=True),
            last_progress_s=at_s,
        )

    def step(
        self, attempt: int, step: int, at_s: float, checkpoint: str | None, commit_ms: float | None
    ) -> None:
        self.store.insert(
            progress,
            job_id=self.job_id,
            attempt=attempt,
            step=step,
            at_s=at_s,
            checkpoint=checkpoint,
            commit_ms=commit_ms,
        )

    def event(self, at_s: float, replica: str | None, kind: str, text: str) -> None:
        self.store.insert(
            events, job_id=self.job_id, at_s=at_s, replica=replica, kind=kind, text=text
        )
        if kind == "custom_message":
            self._notify("custom_message", text, replica=replica)

    def restart(self, **values: Any) -> int:
        row = self.store.insert(restart_records, job_id=self.job_id, node=NODE, **values)
        about = {k: values.get(k) for k in ("replica", "failure_class", "error_code", "round")}
        text = f"{values.get('error_message')} -> {values.get('decision')}"
        self._notify("restart", text, **about)
        if values.get("isolated"):
            self._notify("isolation", str(values["isolated"]), replica=values.get("replica"))
        return row

    def restart_phases(self, record_id: int, **phases_ms: float) -> None:
        self.store.update_row(restart_records, record_id, **phases_ms)
