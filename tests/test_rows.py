"""Typed store rows (issue 15): a row type holds exactly its table's columns."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from trainguard.records.rows import JobRow
from trainguard.records.schema import jobs
from trainguard.records.store import Store


def test_a_job_row_has_the_columns_of_the_jobs_table() -> None:
    assert [f.name for f in fields(JobRow)] == [c.name for c in jobs.columns]


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
