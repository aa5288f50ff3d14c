"""The node agents through the real master (issue 40): a simulated job of `--nodes` x
`--ranks-per-node` ranks, a real `Master` (a validated spec, a SQLite store in a temporary
TRAINGUARD_HOME, its policy, records and SDK channel) whose backend is the real
`AgentBackend` on 127.0.0.1, against one process of fake agents (`agents_scale.FakeAgent`:
the real wire, ranks that are faked and print `--lines-per-s` lines a second each). Each
run is a fresh master process (this script again); it measures:

- fan-out: from the master's start to every agent told to start (`all_told_s`) and every
  rank's started event sent (`fanout_s`), and to the master's RUNNING (`running_s`);
- the master process's CPU (% of one core) over `--seconds` of every rank printing, the
  lines it took in meanwhile (and the fakes' CPU: they must keep up), and its RSS once
  every rank runs, at the window's start and end, and its peak over the run (the window
  opens once the master's tail of every rank's output is full: `WARM_LINES`);
- a rank killed (the fake sends its exit: SIGKILL, returncode -9, a retryable failure the
  spec restarts the whole job for, no backoff) to the first stop order at any agent
  (`exit_to_stop_ms`), and to the next attempt's start order at the first and at the last
  agent (`exit_to_start_ms`, `exit_to_all_told_ms`), stamped in the fakes' process on this
  machine's `time.time()`; beside them, in the master's process, when the exit reached the
  backend, when the master asked it to stop, when every agent had answered, and when it
  asked it to start (`exit_seen_ms`, `master_*`), and the restart record's phases
  (`record_*`).

    .venv/bin/python bench/agents_master.py --nodes 128 --ranks-per-node 8 --seconds 10 --runs 3

No command runs: the ranks are fake, so this is about the master, not about training.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents_scale import TOKEN, FakeAgent, fleet_parser

from trainguard.backends.agent.backend import AgentBackend
from trainguard.backends.interface import BackendEvent, Launch, ReplicaExited, ReplicaOutput
from trainguard.classify.logtail import TAIL_LINES
from trainguard.master.loop import Master
from trainguard.records.recorder import Recorder
from trainguard.records.store import Store
from trainguard.spec.models import validate_spec
from trainguard.states import JobState
from trainguard.storage.ids import new_job_id

_SAME = ("nodes", "ranks_per_node", "lines_per_s", "seconds", "warm_s")
"""What each run's process is told as this one was."""
WARM_LINES = TAIL_LINES + 10
"""Every rank prints this many lines before the window opens (unless `--warm-s`): by then
the master's tail of each rank's output (`TAIL_LINES`, what an exit's evidence quotes)
is full, and what the window sees of memory is what more lines cost."""


# ------------------------------------------------------------------ the fake agents


async def _fakes(address: str, job: str, nodes: int, lines_per_s: float) -> None:
    """The agents; SIGUSR1 kills a rank of the middle node. On close, what came when (JSON
    on stdout)."""
    agents = [FakeAgent(f"node-{i:04d}", lines_per_s, job=job) for i in range(nodes)]
    killed: dict[str, Any] = {}

    def kill() -> None:
        victim = agents[nodes // 2]
        replica = next(iter(victim.running))
        killed.update(node=victim.node, replica=replica)
        killed["exit_s"] = victim.exit(replica, -9)  # as a SIGKILL from outside ends it

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, kill)
    await asyncio.gather(*(agent.run(address) for agent in agents))
    report = {"killed": killed, "agents": [[a.starts, a.stops] for a in agents]}
    print(json.dumps(report), flush=True)


# ------------------------------------------------------------------ the master


class StampedBackend(AgentBackend):
    """The real backend, with when the master asked it to start and to stop (and when
    every agent had answered the stop), when a failure's exit reached it, and the output
    lines it took in."""

    def __init__(self, job: str, token: str) -> None:
        super().__init__(job, token)
        self.lines = 0
        self.failed_s: list[float] = []
        self.stop_s: list[float] = []
        self.stopped_s: list[float] = []  # every agent answered the stop
        self.start_s: list[float] = []

    def bind(self, emit: Callable[[BackendEvent], None]) -> None:
        def stamped(ev: BackendEvent) -> None:
            if isinstance(ev, ReplicaOutput):
                self.lines += len(ev.segments)
            elif isinstance(ev, ReplicaExited) and not ev.evidence.stop_requested:
                self.failed_s.append(time.time())
            emit(ev)

        super().bind(stamped)

    async def start(self, launches: Sequence[Launch]) -> None:
        self.start_s.append(time.time())
        await super().start(launches)

    async def stop(self, replicas: Sequence[str], grace_s: float) -> None:
        self.stop_s.append(time.time())
        await super().stop(replicas, grace_s)
        self.stopped_s.append(time.time())


def _rss_mib() -> tuple[float, float]:
    """This process's RSS and peak RSS, MiB."""
    kb = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            kb[key] = int(value.split()[0])
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def _cpu_s(pid: int) -> float:
    """utime + stime of process `pid`, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _until(what: Callable[[], bool], timeout_s: float, why: str) -> None:
    end = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > end:
            raise TimeoutError(why)
        await asyncio.sleep(0.005)


async def _measure(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    ranks = args.nodes * args.ranks_per_node
    spec = validate_spec(
        {
            "name": "agents-bench",
            "framework": "pytorch",
            "worker_pools": [
                {"role": "worker", "replicas": ranks, "command": ["python", "train.py"]}
            ],
            "preload": "none",
            "fault_tolerance": {"transient_backoff_s": 0, "stop_grace_period_s": 5},
        }
    )
    store, job_id = Store(home), new_job_id()
    recorder, log_dir = Recorder(store, job_id), home / "jobs" / job_id
    recorder.job_created(
        name=spec.name, spec=spec, log_dir=log_dir, at_s=time.time(), master={"cwd": "/"}
    )
    said: list[str] = []

    def say(text: str) -> None:
        said.append(text)
        print(f"trainguard: {text}", file=sys.stderr, flush=True)

    backend = StampedBackend(job_id, TOKEN)
    host, port = await backend.listen()
    fakes = subprocess.Popen(
        [sys.executable, __file__, "--fake-agents", f"{host}:{port}", "--job", job_id,
         "--nodes", str(args.nodes), "--lines-per-s", str(args.lines_per_s)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        await backend.wait_for_agents(args.nodes, 120)
        master = Master(
            job_id=job_id,
            spec=spec,
            backend=backend,
            recorder=recorder,
            log_dir=log_dir,
            cwd="/",
            say=say,
        )
        t0 = time.time()
        run = asyncio.ensure_future(master.run())

        def running(attempt: int) -> bool:
            if run.done():
                raise RuntimeError(f"the master ended: {master.state}; it said {said[-3:]}")
            return master.attempt == attempt and master.state is JobState.RUNNING

        await _until(lambda: running(0), 120, "the first attempt never ran")
        running_s = time.time() - t0
        rss_running, _ = _rss_mib()
        await asyncio.sleep(WARM_LINES / args.lines_per_s if args.warm_s is None else args.warm_s)
        rss0, _ = _rss_mib()
        lines0, cpu0, w0 = backend.lines, time.process_time(), time.monotonic()
        fakes_cpu0 = _cpu_s(fakes.pid)
        await asyncio.sleep(args.seconds)
        cpu_s, wall_s, lines = time.process_time() - cpu0, time.monotonic() - w0, backend.lines
        fakes_cpu_s = _cpu_s(fakes.pid) - fakes_cpu0
        rss1, _ = _rss_mib()
        fakes.send_signal(signal.SIGUSR1)
        await _until(lambda: running(1), 120, "the next attempt never ran")
        master.cancel("the benchmark is done")
        outcome = await asyncio.wait_for(run, 120)
        assert outcome.state is JobState.CANCELLED, outcome
        out, _ = fakes.communicate(timeout=60)
    finally:
        if fakes.poll() is None:
            fakes.kill()
            fakes.wait()
    _, hwm = _rss_mib()
    report = json.loads(out)
    exit_s = report["killed"]["exit_s"]
    starts = [s for starts, _ in report["agents"] for s in starts]
    first = [s for s in starts if s[0] == 0]
    again = [s for s in starts if s[0] == 1]
    stops = [t for _, stops in report["agents"] for t in stops if t >= exit_s]
    assert len(first) == len(again) == args.nodes, (len(first), len(again))  # one start each
    restart = [t for t in backend.start_s if t > exit_s]
    (record,) = store.restarts_of(job_id)
    return {
        "ranks": ranks,
        "fanout_s": max(sent for _, _, sent in first) - t0,
        "all_told_s": max(came for _, came, _ in first) - t0,
        "running_s": running_s,
        "master_cpu_pct": 100 * cpu_s / wall_s,
        "lines_per_s": (lines - lines0) / wall_s,
        "fakes_cpu_pct": 100 * fakes_cpu_s / wall_s,
        "rss_running_mib": rss_running,
        "rss_start_mib": rss0,
        "rss_end_mib": rss1,
        "rss_peak_mib": hwm,
        "exit_to_stop_ms": 1000 * (min(stops) - exit_s),
        "exit_to_start_ms": 1000 * (min(came for _, came, _ in again) - exit_s),
        "exit_to_all_told_ms": 1000 * (max(came for _, came, _ in again) - exit_s),
        "exit_to_all_started_ms": 1000 * (max(sent for _, _, sent in again) - exit_s),
        "exit_seen_ms": 1000 * (min(t for t in backend.failed_s if t >= exit_s) - exit_s),
        "master_stop_ms": 1000 * (min(t for t in backend.stop_s if t >= exit_s) - exit_s),
        "master_stopped_ms": 1000 * (min(t for t in backend.stopped_s if t >= exit_s) - exit_s),
        "master_start_ms": 1000 * (min(restart) - exit_s),
        "record_stop_ms": record.stop_ms or 0.0,
        "record_schedule_ms": record.schedule_ms or 0.0,
        "record_start_ms": record.start_ms or 0.0,
        "restart_said": next((s for s in said if "failed" in s), ""),
    }


# ------------------------------------------------------------------ main


def main() -> None:
    p = fleet_parser(__doc__)
    p.add_argument(
        "--warm-s",
        type=float,
        help=f"how long every rank prints before the window (default: {WARM_LINES} lines)",
    )
    p.add_argument("--json", type=Path, help="write every run here too")
    p.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fake_agents:
        asyncio.run(_fakes(args.fake_agents, args.job, args.nodes, args.lines_per_s))
        return
    if args.one_run:
        with tempfile.TemporaryDirectory(prefix="tg-agents-") as home:
            os.environ["TRAINGUARD_HOME"] = home
            print(json.dumps(asyncio.run(_measure(args, Path(home)))), flush=True)
        return
    runs: list[dict[str, Any]] = []
    same = [f"--{k.replace('_', '-')}={v}" for k in _SAME if (v := getattr(args, k)) is not None]
    for i in range(args.runs):
        done = subprocess.run(
            [sys.executable, __file__, "--one-run", *same],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
            timeout=600,
        )
        runs.append(json.loads(done.stdout.splitlines()[-1]))
        print(f"run {i + 1}: {json.dumps(runs[-1])}", flush=True)
    for key, value in runs[0].items():
        if isinstance(value, int | float):
            values = [r[key] for r in runs]
            shown = ", ".join(f"{v:.3g}" for v in values)
            print(f"{key:<24} median {statistics.median(values):10.3f}   runs [{shown}]")
    print(f"{'decided':<24} {runs[0]['restart_said']}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "runs": runs}))


if __name__ == "__main__":
    main()
