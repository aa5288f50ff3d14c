"""Policy simulator: a failure schedule replayed through the real policy, in simulated time.

A job of N replicas, each failing as a Poisson process, runs for a simulated duration. Every
failure becomes a real `Failure` with a real `Classification` (`classify_exit` on
representative evidence) and goes through the real `decide_failure` and `Budgets.after`; the
decision is then applied to the job's timeline, with no sleeping and no processes. It prints
the effective training time ratio (productive time / wall time) with the given checkpoint
interval, with Young's interval sqrt(2 x checkpoint cost x job MTBF) (the advice goodput.py
gives), and with the spec's default budgets, next to a closed-form approximation.

    python bench/simulate.py                 # 10,000 replicas, replica MTBF 5 years, 30 days
    python bench/simulate.py --replicas 100 --replica-mtbf-h 0.072 --execution-mode async

The model, which the numbers depend on:
- a cycle is `interval` seconds: train for interval - cost, then pause `cost` seconds to
  checkpoint; a checkpoint counts once written. With no failure the ratio is 1 - cost/interval;
- failures arrive while the job runs (training or checkpointing) at rate N / replica MTBF, on
  a replica drawn uniformly; none arrive during a job restart (Young's model);
- RestartJob (and WaitForCapacity): the work since the last checkpoint is redone, the job
  pauses `restart cost` seconds (detect + stop + start + load), then resumes from that
  checkpoint with a fresh cycle;
- RestartReplica (async mode): the other replicas keep training, and the job loses that
  replica's share for its restart, restart cost / N seconds; nothing is redone (an async
  worker's pushed updates outlive it);
- FailJob: the job ends there, with its work since the last checkpoint lost.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import functools
import itertools
import math
import pstats
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.policy.actions import FailJob, RestartJob, RestartReplica, WaitForCapacity, describe
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import decide_failure
from trainguard.spec.limits import UNLIMITED
from trainguard.spec.models import ExecutionMode, FaultTolerance

HOUR_S = 3600.0
DAY_S = 86400.0
YEAR_H = 365.25 * 24

TRACEBACK = (
    "Traceback (most recent call last):",
    '  File "train.py", line 88, in <module>',
    "    lr = config['lr']",
    "KeyError: 'lr'",
)

KINDS: dict[str, Callable[[str], ExitEvidence]] = {
    # SIGSEGV mid-training: transient, charged to max_transient_restarts
    "segv": lambda replica: ExitEvidence(replica, -11, progressed=True),
    # SIGKILL from outside: preemption, retryable with no class budget of its own
    "kill": lambda replica: ExitEvidence(replica, -9),
    # the machine went away: charged to max_node_lost_restarts
    "node": lambda replica: ExitEvidence(replica, None, node_lost="heartbeats stopped"),
    # a bug in the training code: not retryable, so the policy fails the job
    "bug": lambda replica: ExitEvidence(replica, 1, log_tail=TRACEBACK),
}

BUDGET_FIELDS = (
    "max_num_of_job_restart",
    "max_replica_restarts",
    "max_num_of_same_error",
    "max_transient_restarts",
    "max_capacity_restarts",
    "max_internal_restarts",
    "max_node_lost_restarts",
)

Mix = tuple[tuple[str, float], ...]


def parse_mix(text: str) -> Mix:
    """`segv=0.5,kill=0.3,node=0.2,bug=0` -> the kinds with a weight above 0."""
    pairs: list[tuple[str, float]] = []
    for item in text.split(","):
        name, _, weight = item.partition("=")
        name = name.strip()
        if name not in KINDS:
            raise ValueError(f"mix: unknown failure kind {name!r}; known: {', '.join(KINDS)}")
        try:
            w = float(weight)
        except ValueError:
            raise ValueError(f"mix: {name} needs a weight >= 0, got {weight!r}") from None
        if not w >= 0:
            raise ValueError(f"mix: {name} needs a weight >= 0, got {weight!r}")
        if w > 0:
            pairs.append((name, w))
    if not pairs:
        raise ValueError(f"mix: no kind has a weight above 0 in {text!r}")
    return tuple(pairs)


DEFAULT_MIX = "segv=0.5,kill=0.3,node=0.2,bug=0"


@dataclass(frozen=True)
class Setup:
    """The job and its failure schedule: everything but the interval and the budgets."""

    replicas: int = 10_000
    replica_mtbf_s: float = 5 * YEAR_H * HOUR_S
    duration_s: float = 30 * DAY_S
    checkpoint_cost_s: float = 120.0
    restart_cost_s: float = 600.0
    mix: Mix = field(default_factory=lambda: parse_mix(DEFAULT_MIX))
    seed: int = 0
    max_events: int | None = None  # stop after this many failures (a cap for timing runs)

    def __post_init__(self) -> None:
        checks = {
            "replicas": self.replicas >= 1,
            "replica_mtbf_s": self.replica_mtbf_s > 0,
            "duration_s": self.duration_s > 0 and math.isfinite(self.duration_s),
            "checkpoint_cost_s": 0 <= self.checkpoint_cost_s < math.inf,
            "restart_cost_s": 0 <= self.restart_cost_s < math.inf,
            "max_events": self.max_events is None or self.max_events >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: out of range, got {getattr(self, name)!r}")

    @property
    def job_mtbf_s(self) -> float:
        return self.replica_mtbf_s / self.replicas


@dataclass(frozen=True)
class Result:
    """Where one simulated job's wall time went; the parts add up to `wall_s`."""

    interval_s: float
    wall_s: float  # the duration, or less when the policy failed the job
    productive_s: float
    checkpoint_s: float
    redone_s: float  # work lost to a job restart and done again
    restart_s: float  # the whole job paused for restarts
    replica_restart_s: float  # async: one replica's share while it restarts alone
    failures: int
    job_restarts: int
    replica_restarts: int
    ended: str | None = None  # the FailJob decision, described, when the policy ended the job

    @property
    def ratio(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s else 0.0


def fault_tolerance(mode: ExecutionMode, budgets: str) -> FaultTolerance:
    """The spec's defaults, or every budget unlimited (3 restarts would end a 30-day job)."""
    if budgets == "default":
        return FaultTolerance(execution_mode=mode)
    return FaultTolerance(execution_mode=mode, **{f: UNLIMITED for f in BUDGET_FIELDS})


def young_interval_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young's checkpoint interval sqrt(2 C M), as goodput.py advises it."""
    return math.sqrt(2 * checkpoint_cost_s * mtbf_s)


def expected_ratio(setup: Setup, interval_s: float, mode: ExecutionMode) -> float:
    """The first-order closed form, for comparison: sync (1 - C/T)(1 - (T/2 + R)/M); async,
    where a failure costs one replica's share, (1 - C/T)(1 - R/replica MTBF)."""
    c, r, m = setup.checkpoint_cost_s, setup.restart_cost_s, setup.job_mtbf_s
    if math.isinf(m):
        return 1 - c / interval_s
    lost = r / setup.replica_mtbf_s if mode is ExecutionMode.ASYNC else (interval_s / 2 + r) / m
    return max(0.0, (1 - c / interval_s) * (1 - lost))


@functools.cache
def _names(n: int) -> tuple[str, ...]:
    return tuple(f"worker-{i}" for i in range(n))


@functools.cache
def _classified(kind: str, replica: str) -> tuple[Classification, tuple[str, ...]]:
    """A kind's real classification for one replica, once: the evidence never changes."""
    ev = KINDS[kind](replica)
    return classify_exit(ev), ev.log_tail


def simulate(setup: Setup, ft: FaultTolerance, interval_s: float) -> Result:
    """One job from start to its duration (or its FailJob), failure by failure."""
    cost, pause_s, end = setup.checkpoint_cost_s, setup.restart_cost_s, setup.duration_s
    if not interval_s > cost:
        raise ValueError(f"interval {interval_s:g} s must be longer than the checkpoint cost")
    train = interval_s - cost
    n = setup.replicas
    rate = n / setup.replica_mtbf_s
    names = _names(n)
    kinds = [k for k, _ in setup.mix]
    cum = list(itertools.accumulate(w for _, w in setup.mix))
    limit = math.inf if setup.max_events is None else setup.max_events
    rng = random.Random(setup.seed)
    expo, uniform = rng.expovariate, rng.random

    budgets = Budgets()
    t = cycle = 0.0  # now, and when the current cycle began
    productive = ckpt = redone = restart = replica_restart = 0.0
    failures = job_restarts = replica_restarts = 0
    ended: str | None = None
    while True:
        # Three draws per failure whatever happens, so runs that differ only in their
        # interval or budgets see the same failures (common random numbers).
        t_fail = t + (expo(rate) if rate > 0 else math.inf)
        who = int(uniform() * n)
        kind = kinds[bisect.bisect_right(cum, uniform() * cum[-1])]
        stop = min(t_fail, end)
        done = math.floor((stop - cycle) / interval_s)
        if done > 0:  # whole cycles completed before `stop`
            productive += done * train
            ckpt += done * cost
            cycle += done * interval_s
        into = stop - cycle
        work, writing = min(into, train), max(0.0, into - train)
        if t_fail >= end or failures >= limit:
            productive += work
            ckpt += writing
            wall = stop
            break

        failures += 1
        replica = names[who]
        classification, tail = _classified(kind, replica)
        failure = Failure(
            replica, "worker", who, job_restarts + 1, None, t_fail, classification, tail
        )
        decision = decide_failure(ft, budgets, failure, n)
        budgets = budgets.after(failure, decision)
        if isinstance(decision, RestartReplica):
            replica_restarts += 1
            replica_restart += pause_s / n
            t = t_fail  # the cycle goes on
            continue
        redone += work  # the cycle's work and any half-written checkpoint are lost
        ckpt += writing
        if isinstance(decision, FailJob):
            ended = f"{describe(decision)}; {decision.message}"
            wall = t_fail
            break
        if not isinstance(decision, RestartJob | WaitForCapacity):
            raise AssertionError(f"decide_failure returned {decision!r}")
        job_restarts += 1
        paused = min(pause_s, end - t_fail)
        restart += paused
        t = cycle = t_fail + paused
        if t >= end:
            wall = end
            break

    return Result(
        interval_s=interval_s,
        wall_s=wall,
        productive_s=productive - replica_restart,
        checkpoint_s=ckpt,
        redone_s=redone,
        restart_s=restart,
        replica_restart_s=replica_restart,
        failures=failures,
        job_restarts=job_restarts,
        replica_restarts=replica_restarts,
        ended=ended,
    )


# ---------------------------------------------------------------- command line


def _duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds >= 365.25 * DAY_S:
        return f"{seconds / (365.25 * DAY_S):.3g} y"
    if seconds >= DAY_S:
        return f"{seconds / DAY_S:.3g} d"
    if seconds >= HOUR_S:
        return f"{seconds / HOUR_S:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.3g} s"


def _ending(r: Result, setup: Setup) -> str:
    if r.ended:
        return "FailJob"
    return "ran to the end" if r.wall_s >= setup.duration_s else "max events"


def report(
    setup: Setup,
    mode: ExecutionMode,
    columns: Sequence[tuple[str, Result, float]],
) -> str:
    """The side-by-side table; each column is (heading, result, seconds it took to run)."""
    mix = ", ".join(f"{k} {w / sum(w for _, w in setup.mix):.0%}" for k, w in setup.mix)
    lines = [
        f"trainguard policy simulator: {setup.replicas} replicas ({mode}), replica MTBF "
        f"{_duration(setup.replica_mtbf_s)} -> job MTBF {_duration(setup.job_mtbf_s)}, "
        f"{_duration(setup.duration_s)} simulated, seed {setup.seed}",
        f"checkpoint cost {setup.checkpoint_cost_s:g} s, restart cost "
        f"{setup.restart_cost_s:g} s, failure mix: {mix}",
        "",
    ]

    def hours(s: float) -> str:
        return f"{s / HOUR_S:.1f} h"

    rows: list[tuple[str, Callable[[Result, float], str]]] = [
        ("checkpoint interval", lambda r, _: _duration(r.interval_s)),
        ("effective training time ratio", lambda r, _: f"{r.ratio:.4f}"),
        (
            "closed-form approximation",
            lambda r, _: f"{expected_ratio(setup, r.interval_s, mode):.4f}",
        ),
        ("failures", lambda r, _: str(r.failures)),
        ("job restarts", lambda r, _: str(r.job_restarts)),
        ("replica restarts", lambda r, _: str(r.replica_restarts)),
        ("productive", lambda r, _: hours(r.productive_s)),
        ("lost to job restarts", lambda r, _: hours(r.restart_s)),
        ("lost to replica restarts", lambda r, _: hours(r.replica_restart_s)),
        ("lost to redone work", lambda r, _: hours(r.redone_s)),
        ("spent checkpointing", lambda r, _: hours(r.checkpoint_s)),
        ("wall time", lambda r, _: hours(r.wall_s)),
        ("ended", lambda r, _: _ending(r, setup)),
        ("simulator time", lambda _, s: f"{s:.3f} s"),
        ("events/s", lambda r, s: f"{r.failures / s:,.0f}" if s > 0 else "-"),
    ]
    width = max(16, *(len(h) + 2 for h, _, _ in columns))
    lines.append(f"{'':32}" + "".join(f"{h:>{width}}" for h, _, _ in columns))
    for label, cell in rows:
        lines.append(f"{label:32}" + "".join(f"{cell(r, s):>{width}}" for _, r, s in columns))
    for heading, r, _ in columns:
        if r.ended:
            lines.append(f"\n{heading}: ended at {_duration(r.wall_s)}: {r.ended}")
    events = sum(r.failures for _, r, _ in columns)
    spent = sum(s for _, _, s in columns)
    lines.append(
        f"\n{events:,} failure events through decide_failure + Budgets.after in {spent:.2f} s"
        + (f" ({events / spent:,.0f} events/s)" if spent > 0 else "")
    )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--replicas", type=int, default=10_000)
    p.add_argument(
        "--replica-mtbf-h",
        type=float,
        default=5 * YEAR_H,
        help="mean hours between failures of one replica (default 5 years; inf: none)",
    )
    p.add_argument("--days", type=float, default=30.0, help="simulated duration")
    p.add_argument("--checkpoint-cost-s", type=float, default=120.0)
    p.add_argument("--restart-cost-s", type=float, default=600.0)
    p.add_argument("--interval-s", type=float, default=3600.0, help="checkpoint interval")
    p.add_argument("--mix", default=DEFAULT_MIX, help=f"weights of {', '.join(KINDS)}")
    p.add_argument(
        "--budgets",
        choices=("unlimited", "default"),
        default="unlimited",
        help="budgets of the first two columns; a third shows the spec's defaults",
    )
    p.add_argument("--execution-mode", choices=[m.value for m in ExecutionMode], default="sync")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-events", type=int, default=None, help="stop a run after N failures")
    p.add_argument("--profile", action="store_true", help="profile the first column")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        setup = Setup(
            replicas=args.replicas,
            replica_mtbf_s=args.replica_mtbf_h * HOUR_S,
            duration_s=args.days * DAY_S,
            checkpoint_cost_s=args.checkpoint_cost_s,
            restart_cost_s=args.restart_cost_s,
            mix=parse_mix(args.mix),
            seed=args.seed,
            max_events=args.max_events,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mode = ExecutionMode(args.execution_mode)
    young = young_interval_s(setup.checkpoint_cost_s, setup.job_mtbf_s)
    if not args.interval_s > setup.checkpoint_cost_s:
        print("error: --interval-s must be longer than --checkpoint-cost-s", file=sys.stderr)
        return 2
    runs = [(f"given, {args.budgets}", fault_tolerance(mode, args.budgets), args.interval_s)]
    if young > setup.checkpoint_cost_s:
        runs.append((f"Young, {args.budgets}", fault_tolerance(mode, args.budgets), young))
    else:  # the job MTBF is under half the cost: the formula has no sensible answer
        print(f"(no Young column: its interval {young:.3g} s is not longer than the cost)")
    if args.budgets != "default":
        runs.append(("given, default", fault_tolerance(mode, "default"), args.interval_s))
    for kind, _ in setup.mix:  # the names and the signature catalogue, before any clock
        _classified(kind, _names(setup.replicas)[0])
    columns: list[tuple[str, Result, float]] = []
    for i, (heading, ft, interval) in enumerate(runs):
        profiler = cProfile.Profile() if args.profile and i == 0 else None
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = simulate(setup, ft, interval)
        if profiler is not None:
            profiler.disable()
        columns.append((heading, result, time.perf_counter() - t0))
        if profiler is not None:
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(12)
    print(report(setup, mode, columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
