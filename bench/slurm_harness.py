"""What the Slurm benchmarks (bench/slurm_node_loss.py, bench/slurm_scale.py) share: the real
cluster of tests/clusters/slurmcluster.py, the tools they compare, and a job's output as it
arrives."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "clusters"))  # the test cluster, by bare name

from hosts import hosts_on_a_bridge  # noqa: E402
from slurmcluster import SlurmCluster as SlurmCluster  # noqa: E402 (the scripts' type, from here)
from slurmcluster import require_slurm, sweep  # noqa: E402

PY = sys.executable
TRAINGUARD = str(Path(PY).with_name("trainguard"))
TORCHRUN = str(Path(PY).with_name("torchrun"))
STEP = re.compile(r"step (\d+) loss")  # a training step of examples/ddp_train.py


@contextlib.contextmanager
def started_cluster(nodes: int) -> Iterator[SlurmCluster]:
    """A Slurm cluster on `nodes` fresh hosts for a whole benchmark, stopped after; what an
    earlier run that was killed left is swept first."""
    require_slurm()
    sweep()
    with hosts_on_a_bridge(nodes) as hosts, contextlib.ExitStack() as stop:
        cluster = SlurmCluster(hosts)
        stop.callback(cluster.stop)
        cluster.start()
        yield cluster


def srun_torchrun(
    nodes: int, per_node: int, *, restarts: int, head: str, rdzv_id: str
) -> list[str]:
    """`srun` of a torchrun agent on each of `nodes` nodes, `per_node` ranks each, its
    rendezvous on `head`: what the benchmarks hold trainguard against."""
    launch = [
        TORCHRUN,
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        f"--max-restarts={restarts}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={head}:29400",
        f"--rdzv-id={rdzv_id}",
    ]
    return ["srun", f"-N{nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=0", *launch]


class Watch:
    """Every line of a process's output, with the time it arrived."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._threads = [
            threading.Thread(target=self._read, args=(s,), daemon=True)
            for s in (proc.stdout, proc.stderr)
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append((time.time(), line.rstrip("\n")))

    def max_step(self) -> int:
        steps = [int(m[1]) for _, line in list(self.lines) if (m := STEP.search(line))]
        return max(steps, default=0)

    def first_after(self, t0: float, pattern: re.Pattern[str]) -> float | None:
        return next((t for t, line in list(self.lines) if t > t0 and pattern.search(line)), None)
