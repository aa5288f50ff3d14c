"""How long the master takes to build every replica's environment for a large job.

For each preset and job size, every replica's `replica_env` is built as the master builds
them at a launch (one Roster per job), three times; the median is printed.

    python bench/env_build.py --sizes 1024,4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from trainguard.frameworks import EnvContext, Roster, preset
from trainguard.frameworks.replica_plan import plan_replicas, replica_env
from trainguard.spec.models import validate_spec


def _pools(framework: str, n: int) -> list[dict[str, Any]]:
    if framework == "tensorflow":
        return [
            {"role": "chief", "command": ["x"]},
            {"role": "worker", "replicas": n - 1, "command": ["x"]},
        ]
    return [{"replicas": n, "command": ["x"]}]


def build_all(framework: str, n: int) -> float:
    spec = validate_spec(
        {"name": "j", "framework": framework, "worker_pools": _pools(framework, n)}
    )
    plans = tuple(plan_replicas(spec))
    roster = Roster(plans, {p.name: f"10.0.0.1:{1000 + p.rank}" for p in plans})
    t0 = time.perf_counter()
    for plan in plans:
        ctx = EnvContext(plan, roster, "j", "10.0.0.1", 29500, 0, 3)
        replica_env(preset(framework), ctx)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1024,4096")
    args = p.parse_args()
    for framework in ("pytorch", "tensorflow"):
        for n in (int(x) for x in args.sizes.split(",")):
            runs = [build_all(framework, n) for _ in range(3)]
            print(f"{framework}, {n} replicas: {statistics.median(runs) * 1000:.0f} ms median of 3")


if __name__ == "__main__":
    main()
