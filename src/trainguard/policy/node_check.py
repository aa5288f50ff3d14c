"""The node check before a suspicious retry, as pure values: which failures call for it, how
the nodes pair up for the all-reduce, how the results are judged, which nodes to keep out.

Copied from DLRover's node check (docs/design/straggler-detection.md and
dlrover/trainer/torch/node_check/utils.py): nodes are checked in small worlds of two, each
runs a matmul and a collective and reports its elapsed time, a failure counts as an
infinite time, and a node's time is the best of its worlds, so a slow or cut node is the
one whose every world is slow or failed while its peers have a good one elsewhere. Here the
worlds are a ring of pairs (i, i+1), run at once rather than in two rounds, so one check
costs one timeout at most. From NVIDIA's ft_launcher (nvidia-resiliency-ext), the rule
that a node failing its health check sits out the next rendezvous, and that a check which
cannot run says so (never "healthy" by default). The outlier rule (3x the median) is this
issue's; an absolute floor keeps the jitter of a busy machine from naming a healthy node.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainguard.classify.classes import Classification, FailureClass
from trainguard.classify.readings import Finding

OUTLIER_FACTOR = 3.0
"""A node this many times slower than the median is an outlier."""

CHECK_LIMIT_S = 20.0
"""The whole check, process start on every node included (a busy node imports torch in
seconds); past it every node that has not answered counts as timed out."""

COLLECTIVE_TIMEOUT_S = 4.0
"""The all-reduce of one pair, from the moment both have joined."""

_NETWORK_RULES = (
    "collective-timeout",
    "nccl-error",
    "nccl-cuda-error",
    "peer-connection-lost",
    "connection-refused",
    "rendezvous-failure",
    "network-timeout",
)
_MACHINE_SIGNALS = ("SIGSEGV", "SIGBUS")
_MACHINE_FINDINGS = frozenset(
    {
        Finding.XID,
        Finding.GPU_LOST,
        Finding.GPU_MEMORY,
        Finding.GPU_RESET,
        Finding.HUNG_TASK,
        Finding.IO_ERROR,
    }
)


def check_reason(c: Classification) -> str | None:
    """Why this failure may be the machine's, so the nodes are checked before the retry;
    None where it is the job's (a bug, a configuration) or says nothing of a machine, and
    for a lost node: the backend's probe named it and keeps it out already, and a check of
    the others would only delay the retry (~5 s)."""
    if c.failure_class is FailureClass.NODE_LOST:
        return None
    if c.hardware:
        return f"a hardware error ({c.rule})"
    for r in c.readings:
        if r.finding in _MACHINE_FINDINGS:
            return f"the machine's evidence ({r.source}: {r.reading})"
    if c.rule.removesuffix("-untrained") in _NETWORK_RULES:
        return f"a network or collective error ({c.rule})"
    if c.signal in _MACHINE_SIGNALS and c.matched_line is None:
        return f"a bare {c.signal} with no sign of the job's code"
    return None


def ring_pairs(count: int) -> tuple[tuple[int, int], ...]:
    """The worlds of two: (i, i+1) around the ring, so each node has two peers (one where
    there are only two nodes, none alone)."""
    if count < 2:
        return ()
    if count == 2:
        return ((0, 1),)
    return tuple((i, (i + 1) % count) for i in range(count))


@dataclass(frozen=True)
class PairResult:
    """One node's report of one world: its all-reduce's seconds, or what went wrong."""

    ok: bool
    seconds: float = 0.0
    error: str = ""


@dataclass(frozen=True)
class NodeReport:
    """What the check on one node printed: the compute kernel's answer and time, each
    world's all-reduce (by the world's index in `ring_pairs`)."""

    compute_ok: bool
    compute_s: float
    compute_error: str = ""
    pairs: Mapping[int, PairResult] = field(default_factory=dict)
    kernel: str = ""  # torch, or python where torch is missing


@dataclass(frozen=True)
class Limits:
    factor: float = OUTLIER_FACTOR
    compute_floor_s: float = 0.3  # slower than the median by less is a busy machine's noise
    network_floor_s: float = 0.3


@dataclass(frozen=True)
class Verdict:
    """The check's reading: each bad node with why (worst first), and what could not be
    told (every pair failed: no node to blame)."""

    bad: Mapping[str, str]
    unclear: str = ""

    @property
    def passed(self) -> bool:
        return not self.bad and not self.unclear


def judge(
    nodes: Sequence[str],
    reports: Mapping[str, NodeReport | str],
    limits: Limits = Limits(),
) -> Verdict:
    """Each node's fault, from its report, or why it has none (a str: it timed out or its
    check could not start there). A node is bad when its check did not answer, its kernel
    gave a wrong answer, every world it was in failed (while some world succeeded), or its
    best time is an outlier."""
    bad: dict[str, str] = {}
    for n in nodes:
        r = reports.get(n, "no report")
        if isinstance(r, str):
            bad[n] = f"its check did not answer ({r})"
        elif not r.compute_ok:
            bad[n] = f"its compute check failed ({r.compute_error or 'wrong answer'})"
    answered = {n: r for n, r in reports.items() if n in nodes and isinstance(r, NodeReport)}
    computes = {n: r.compute_s for n, r in answered.items() if r.compute_ok}
    for n, why in _outliers(computes, limits.factor, limits.compute_floor_s).items():
        bad.setdefault(n, f"its compute check took {why}")
    worlds = _worlds(nodes, answered)
    best = _best_per_node(nodes, worlds)
    if best and all(math.isinf(t) for t in best.values()):
        failed = [n for n in nodes if n not in bad]
        why = _first_error(answered) or "no answer"
        unclear = f"the all-reduce failed between every pair ({', '.join(failed)}): {why}"
        return Verdict(bad, unclear if len(failed) > 1 else "")
    for n, t in best.items():
        if math.isinf(t) and n not in bad:
            bad[n] = f"its all-reduce failed with every peer ({_error_of(n, answered)})"
    finite = {n: t for n, t in best.items() if not math.isinf(t)}
    for n, why in _outliers(finite, limits.factor, limits.network_floor_s).items():
        bad.setdefault(n, f"its all-reduce took {why}")
    return Verdict(bad)


def _worlds(
    nodes: Sequence[str], answered: Mapping[str, NodeReport]
) -> dict[tuple[int, int], float]:
    """Each world's time: the slower member's report; inf where either failed or is silent."""
    out: dict[tuple[int, int], float] = {}
    for index, (a, b) in enumerate(ring_pairs(len(nodes))):
        seen = [
            answered[nodes[x]].pairs.get(index) if nodes[x] in answered else None for x in (a, b)
        ]
        ok = [p.seconds for p in seen if p is not None and p.ok]
        out[(a, b)] = max(ok) if len(ok) == 2 else math.inf
    return out


def _best_per_node(
    nodes: Sequence[str], worlds: Mapping[tuple[int, int], float]
) -> dict[str, float]:
    best: dict[str, float] = {}
    for (a, b), t in worlds.items():
        for x in (a, b):
            best[nodes[x]] = min(best.get(nodes[x], math.inf), t)
    return best


def _outliers(times: Mapping[str, float], factor: float, floor_s: float) -> dict[str, str]:
    """node -> "T s, over 3x the median M s": only among three or more (of two, neither
    is the odd one out)."""
    if len(times) < 3:
        return {}
    median = statistics.median(times.values())
    return {
        n: f"{t:.2f} s, over {factor:g}x the median {median:.3f} s"
        for n, t in times.items()
        if t > factor * median and t - median > floor_s
    }


def _error_of(node: str, answered: Mapping[str, NodeReport]) -> str:
    r = answered.get(node)
    errors = [p.error for p in (r.pairs.values() if r else ()) if not p.ok and p.error]
    return errors[0] if errors else "its peers saw it fail"


def _first_error(answered: Mapping[str, NodeReport]) -> str:
    for r in answered.values():
        for p in r.pairs.values():
            if not p.ok and p.error:
                return p.error
    return ""


@dataclass(frozen=True)
class KeepOut:
    """What the backend does with a verdict: the nodes it excludes, and the bad ones it
    must keep (no spare node), each with why."""

    excluded: Mapping[str, str]
    kept: Mapping[str, str]


def keep_out(verdict: Verdict, usable: Sequence[str], need: int) -> KeepOut:
    """Exclude bad nodes, in the allocation's order, while `need` nodes are left; the rest
    stay in (the job restarts on the nodes it has) and are named as kept."""
    spare = len(usable) - need
    excluded: dict[str, str] = {}
    kept: dict[str, str] = {}
    for n in usable:
        why = verdict.bad.get(n)
        if why is None:
            continue
        if len(excluded) < spare:
            excluded[n] = why
        else:
            kept[n] = why
    return KeepOut(excluded, kept)


def describe_check(reason: str, verdict: Verdict, plan: KeepOut, seconds: float) -> str:
    """One line for the restart record and the log."""
    head = f"node check after {reason} ({seconds:.1f} s)"
    parts = [f"{n} {why}: excluded from later attempts" for n, why in plan.excluded.items()]
    parts += [
        f"{n} {why}: no spare node in the allocation, the job restarts on it"
        for n, why in plan.kept.items()
    ]
    if verdict.unclear:
        parts.append(f"no node to blame: {verdict.unclear}")
    return f"{head}: " + ("; ".join(parts) if parts else "every node passed")
