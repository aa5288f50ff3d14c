"""Typed store rows (issue 15): a row type per table, holding exactly its columns."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from trainguard.records.rows import (
    AttemptRow,
    EventRow,
    FailureRow,
    JobRow,
    NodeEventRow,
    ProgressRow,
    RestartRow,
    RunRow,
    StackDumpRow,
    TransitionRow,
    _Row,
)
from trainguard.records.schema import jobs, metadata
from trainguard.records.store import Store

ROWS: dict[str, type[_Row]] = {
    "jobs": JobRow,
    "attempts": AttemptRow,
    "replica_runs": RunRow,
    "transitions": TransitionRow,
    "restart_records": RestartRow,
    "stack_snapshots": StackDumpRow,
    "progress": ProgressRow,
    "events": EventRow,
    "failure_records": FailureRow,
    "node_events": NodeEventRow,
}


def test_every_table_has_a_row_type_with_exactly_its_columns() -> None:
    assert set(ROWS) == set(metadata.tables)
    for name, kind in ROWS.items():
        table = metadata.tables[name]
        assert [f.name for f in fields(kind)] == [c.name for c in table.columns], name
        for f, c in zip(fields(kind), table.columns, strict=True):
            # a column that may hold NULL is Optional in its row, and only such a column
            optional = "None" in str(f.type)
            assert optional == (c.nullable and not c.primary_key), f"{name}.{c.name}"


def test_the_store_reads_jobs_as_typed_rows(tmp_path: Path) -> None:
    store = Store(tmp_path)
    row = {"spec_json": "{}", "state": "QUEUED", "created_at_s": 1.0, "log_dir": "/l"}
    store.insert(jobs, id="j", name="n", origin="server", priority=3, **row)
    job = store.job("j")
    assert isinstance(job, JobRow)
    assert (job.id, job.state, job.priority, job.attempts, job.ended_at_s) == (
        "j",
        "QUEUED",
        3,
        0,
        None,
    )
    assert store.resolve_job("n") == job == store.jobs_in(["QUEUED"], "server")[0]
    assert store.live_jobs() == [job] and store.list_jobs() == [job]
    assert job.as_dict()["name"] == "n"
    store.close()
