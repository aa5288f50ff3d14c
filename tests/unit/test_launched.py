"""`Launched`: the attempt's launches, which a replica restarted alone is laid out within."""

from __future__ import annotations

from pathlib import Path

from trainguard.backends.interface import Launch
from trainguard.backends.launched import Launched


def _la(attempt: int, rank: int, restart: int = 0) -> Launch:
    name = f"worker-{rank}"
    return Launch(attempt, name, rank, restart, ("x",), {}, "/", Path(f"/l/{name}"))


def test_a_replica_restarted_alone_is_laid_out_with_its_attempts_peers() -> None:
    launched = Launched()
    assert set(launched.add([_la(0, 0), _la(0, 1)])) == {"worker-0", "worker-1"}
    again = launched.add([_la(0, 1, restart=1)])
    assert set(again) == {"worker-0", "worker-1"} and again["worker-1"].restart == 1


def test_a_new_attempt_forgets_the_last_ones_launches() -> None:
    launched = Launched()
    launched.add([_la(0, 0), _la(0, 1)])
    assert set(launched.add([_la(1, 1)])) == {"worker-1"}
    assert launched.add([]) == {}
