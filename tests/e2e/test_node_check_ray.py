"""The node check before a suspicious retry on a real 3-node Ray cluster
(tests/clusters/raycluster.py, on loopback): a job whose replica fails with a network error
is retried after the check ran on every alive node (one pinned task each), and its finding
is in the job's events. A cut or slowed node is tested on Slurm's hosts
(tests/e2e/test_node_check_slurm.py): Ray's test nodes share one loopback, which cannot be
cut for one node alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TG
from raycluster import DRIVER_ENV, RayCluster
from test_ray import spec

from trainguard.master.node_check import NODE_CHECK_EVENT
from trainguard.records.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.ray]

FLAKY = (
    "import os, sys; first = os.environ['TRAINGUARD_ATTEMPT'] == '0'; "
    "print('RuntimeError: Connection reset by peer' if first else 'done', flush=True); "
    "sys.exit(1 if first else 0)"
)


def test_a_network_error_on_ray_is_retried_after_every_node_is_checked(
    tg: TG, ray_cluster: RayCluster, tmp_path: Path
) -> None:
    ray_cluster.heal()
    tg.env.update(DRIVER_ENV)
    job = spec(tmp_path, ray_cluster, 2, [sys.executable, "-c", FLAKY], name="flaky")
    res = tg("run", "--quiet", "-f", job, timeout=180)
    assert res.returncode == 0, res.stderr
    status = tg.only_job()
    assert status["state"] == "SUCCEEDED" and status["attempts"] == 2
    events = Store(tg.home).events_of(status["id"])
    (note,) = [e.text or "" for e in events if e.kind == NODE_CHECK_EVENT]
    assert note.startswith("node check after a network or collective error"), note
    assert note.endswith("every node passed"), note
    print(f"\nray: {note}")
