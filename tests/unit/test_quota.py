"""The queue's rules, as pure decisions: fit, FIFO within priority, expiry, capacity waits."""

from __future__ import annotations

import pytest

from trainguard.service.quota import (
    BEHIND,
    Admit,
    Expire,
    QueuedJob,
    Quota,
    Reject,
    Request,
    Wait,
    plan,
    request_of,
)
from trainguard.spec.models import validate_spec
from trainguard.spec.sizes import parse_memory


def job(
    id: str, cpus: float = 1, gpus: int = 0, prio: int = 0, at: float = 0.0, **kw: object
) -> QueuedJob:
    return QueuedJob(id, Request(cpus, gpus), prio, at, **kw)  # type: ignore[arg-type]


def test_request_sums_every_replica_and_counts_one_cpu_when_unset() -> None:
    spec = validate_spec(
        {
            "name": "j",
            "worker_pools": [
                {"role": "chief", "command": ["x"]},
                {
                    "role": "worker",
                    "replicas": 3,
                    "command": ["x"],
                    "resources": {"cpus": 2, "gpus": 1, "memory": "1Gi"},
                },
            ],
        }
    )
    assert request_of(spec) == Request(cpus=7, gpus=3, memory_b=3 * 2**30, replicas=4)


def test_memory_sizes() -> None:
    assert parse_memory("4Gi") == 4 * 2**30
    assert parse_memory("512M") == 512 * 10**6
    assert parse_memory("2GB") == 2 * 10**9
    with pytest.raises(ValueError, match="not a size"):
        parse_memory("lots")


def test_admits_in_order_while_jobs_fit_then_waits_with_the_reason() -> None:
    quota = Quota(cpus=8, gpus=4)
    queue = [job("a", gpus=2, at=1), job("b", gpus=4, at=2), job("c", gpus=1, at=3)]
    out = plan(queue, Request(), quota, now_s=10)
    assert out[0] == Admit("a")
    assert out[1] == Wait("b", "waiting for 4 gpus, 2 free")
    # FIFO: c would fit, but it does not jump ahead of b.
    assert out[2] == Wait("c", BEHIND)


def test_priority_first_then_fifo() -> None:
    queue = [job("old", at=1), job("urgent", prio=5, at=9), job("new", at=2)]
    out = plan(queue, Request(), Quota(cpus=2), now_s=10)
    assert [type(d).__name__ for d in out] == ["Admit", "Admit", "Wait"]
    assert [d.job_id for d in out] == ["urgent", "old", "new"]


def test_in_use_counts_against_the_quota() -> None:
    out = plan([job("a", cpus=2)], Request(cpus=7), Quota(cpus=8), now_s=0)
    assert out == [Wait("a", "waiting for 2 cpus, 1 free")]


def test_max_wait_expires_a_job_that_still_does_not_fit() -> None:
    queue = [job("a", gpus=4, at=0, max_wait_s=30), job("b", gpus=1, at=0, max_wait_s=30)]
    out = plan(queue, Request(gpus=3), Quota(gpus=4), now_s=31)
    assert isinstance(out[0], Expire) and "4 gpus, 1 free" in out[0].reason
    assert out[1] == Admit("b")  # it fits: a job that can start never expires


def test_too_big_for_the_quota_is_rejected_unless_it_waits_for_capacity() -> None:
    quota = Quota(gpus=4)
    rejected = plan([job("a", gpus=8)], Request(), quota, now_s=0)
    assert isinstance(rejected[0], Reject) and "8 gpus, 4 in the whole quota" in rejected[0].reason
    waits = plan(
        [job("a", gpus=8, wait_for_capacity=True), job("b", gpus=1, at=1)],
        Request(),
        quota,
        now_s=0,
    )
    assert isinstance(waits[0], Wait) and waits[0].reason.startswith("waiting for capacity")
    assert waits[1] == Admit("b")  # a job that can never fit does not block the queue


def test_gpu_ids_are_handed_out_without_overlap() -> None:
    quota = Quota(gpus=4, gpu_ids=(0, 1, 2, 3))
    out = plan([job("a", gpus=2), job("b", gpus=1, at=1)], Request(gpus=1), quota, 0, [1])
    assert out == [Admit("a", (0, 2)), Admit("b", (3,))]


def test_memory_shortage_is_said_in_units() -> None:
    out = plan(
        [QueuedJob("a", Request(memory_b=8 * 2**30), 0, 0)],
        Request(memory_b=60 * 2**30),
        Quota(memory_b=64 * 2**30),
        now_s=0,
    )
    assert out == [Wait("a", "waiting for 8Gi memory, 4Gi free")]
