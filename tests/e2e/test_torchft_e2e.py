"""Real torchft (nightly, gloo on CPU) under trainguard: a fault costs one group, not the job.

examples/torchft_train.py trains the same small model in every replica group; torchft's
Manager averages the groups' gradients each step and heals a restarted group from a live
peer. trainguard runs the Lighthouse and each group's store, and restarts a failed group
alone: the other groups' processes are never touched.
"""

from __future__ import annotations

import itertools
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TG

pytest.importorskip("torch")  # the torch extra; a base install skips this file
pytest.importorskip("torchft")

pytestmark = pytest.mark.slow

EXAMPLE = str(ROOT / "examples" / "torchft_train.py")
_STEP = re.compile(r"^step (\d+) group (\d+) rank (\d+) participants (\d+)")


def _run(tg: TG, groups: int, per: int, *flags: str, train: tuple[str, ...] = ()) -> None:
    res = tg(
        "run",
        "--quiet",
        "--framework",
        "torchft",
        "--groups",
        str(groups),
        "--nproc-per-group",
        str(per),
        *flags,
        "--",
        sys.executable,
        EXAMPLE,
        *train,
        timeout=240,
    )
    assert res.returncode in (0, 1), res.stderr


def _job(tg: TG) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """The job's status, its restart records, and each replica's latest run."""
    status = tg.only_job()
    runs: dict[str, list[dict[str, Any]]] = {}
    for run in status["replicas"]:
        runs.setdefault(str(run["name"]), []).append(run)
    return status, tg.json("records", status["id"]), runs


def _lost_steps(log: Path) -> int:
    """Steps a rank trained without committing them: the step count did not move on."""
    seen = [int(m.group(1)) for line in log.read_text().splitlines() if (m := _STEP.match(line))]
    return sum(1 for a, b in itertools.pairwise(seen) if b <= a)


def test_three_kills_of_a_group_cost_the_other_groups_nothing(tmp_path: Path) -> None:
    """3 groups of 2 ranks; group 1's ranks SIGKILLed 3 times at random moments."""
    rng = random.Random(18)
    # 6 s apart; a kill due while group 1 still restarts from the last one lands when the
    # victim runs again (before, it found no process and fired nothing: 2 restarts of 3 in
    # three fresh-clone runs of 4 workers)
    at = [4 + 6 * i + rng.uniform(0, 1.5) for i in range(3)]
    victims = [rng.choice(("worker-2", "worker-3")) for _ in at]
    injections = [f"--inject=signal:{v}:SIGKILL@{t:.1f}s" for v, t in zip(victims, at, strict=True)]
    tg = TG(tmp_path / "home")
    out = tmp_path / "out"
    # 700 steps (21 s of steps): the job outlives the last kill (at most 17.5 s in)
    train = ("--steps", "700", "--step-time", "0.03", "--out", str(out))
    _run(tg, 3, 2, *injections, train=train)
    status, restarts, runs = _job(tg)
    assert status["state"] == "SUCCEEDED", (injections, status)
    assert len(restarts) == 3, restarts
    assert all(str(r["decision"]).startswith("RestartGroup(group 1:") for r in restarts)
    # the other groups' processes were never stopped or started again: their first run
    for name in ("worker-0", "worker-1", "worker-4", "worker-5", "store-0", "store-2"):
        assert runs[name][-1]["restart"] == 0, (name, runs[name])
    assert runs["worker-2"][-1]["restart"] == runs["worker-3"][-1]["restart"] == 3
    # each fault cost a healthy rank at most one step (a step it could not commit)
    logs = Path(str(runs["worker-0"][0]["log_path"])).parent
    for name in ("worker-0", "worker-1", "worker-4", "worker-5"):
        assert _lost_steps(logs / f"{name}.log") <= 3, name
    # and every group ends with the same weights: group 1 healed from a live peer
    digests = {p.name: p.read_text() for p in out.glob("group-*.sha")}
    assert len(digests) == 3 and len(set(digests.values())) == 1, digests


def test_a_lighthouse_kill_is_survived_without_restarting_a_group(tmp_path: Path) -> None:
    tg = TG(tmp_path / "home")
    train = ("--steps", "200", "--step-time", "0.03")
    _run(tg, 2, 1, "--inject=signal:lighthouse-0:SIGKILL@4s", train=train)
    status, restarts, runs = _job(tg)
    assert status["state"] == "SUCCEEDED"
    (restart,) = restarts
    assert str(restart["decision"]).startswith("RestartReplica(lighthouse-0)")
    assert runs["lighthouse-0"][-1]["restart"] == 1
    assert all(runs[n][-1]["restart"] == 0 for n in ("worker-0", "worker-1", "store-0", "store-1"))


def test_a_bug_in_one_group_fails_the_job_after_the_same_error_rule(tmp_path: Path) -> None:
    """A native crash at the same place on every run of group 1 (after healing, at a new
    step each time): retried as a fault, then the same-error budget ends the job."""
    tg = TG(tmp_path / "home")
    train = ("--steps", "400", "--bug-at-step", "30", "--bug-kind", "segv")
    _run(tg, 2, 1, "--max-num-of-same-error", "2", train=train)
    status, restarts, runs = _job(tg)
    assert status["state"] == "FAILED" and status["error_code"] == "139", status
    assert 1 <= len(restarts) <= 2, restarts
    assert all(str(r["decision"]).startswith("RestartGroup(group 1:") for r in restarts)
    assert runs["worker-0"][-1]["restart"] == 0  # the healthy group was never restarted
