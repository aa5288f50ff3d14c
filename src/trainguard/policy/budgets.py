"""Budgets and the failures they count: what the policy decides from.

`Failure` is one replica's failure as the policy sees it; `Budgets` is every charge made
so far (per layer: job, class, replica, same error) and the history of fingerprints at
their progress points, persistent (each `after()` returns a new value) so a decision is a
pure function of (spec, budgets, failure).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from math import isqrt
from typing import Literal, Self, TypeVar, cast

from trainguard.classify.classes import Classification, ExitEvidence
from trainguard.spec.limits import UNLIMITED

Limit = int | Literal["unlimited"]
V = TypeVar("V")


@dataclass(frozen=True)
class Failure:
    """A structured failure record: who failed, how, and what they said last."""

    replica: str
    role: str
    rank: int
    attempt: int
    pid: int | None
    time_s: float
    classification: Classification
    log_tail: tuple[str, ...] = ()
    restart: int = 0  # the replica's restarts alone within the attempt (async mode)
    progress: int | None = None  # the step the replica had reached; None: none known
    uptime_s: float | None = None  # how long the replica had run when it failed
    evidence: ExitEvidence | None = None  # what it was classified from (None: a hang)
    node: str | None = None  # where it ran (the backend's label); None: the master's host

    @property
    def same_error_key(self) -> str:
        return f"{self.replica}:{self.classification.fingerprint}"

    def occurrence(self) -> Occurrence:
        return Occurrence(self.attempt, self.restart, self.progress, self.uptime_s)


@dataclass(frozen=True)
class Charge:
    """One budget charged by a decision, with what it has used after the charge."""

    budget: str
    used: int
    limit: Limit

    def __str__(self) -> str:
        if self.limit == UNLIMITED:
            return f"{self.budget} {self.used}/unlimited"
        return f"{self.budget} {self.used}/{self.limit} ({int(self.limit) - self.used} left)"


class Layers(Mapping[str, V]):
    """An immutable mapping where `set` is cheap however many keys there are.

    `set` adds a one-key layer over the shared older ones and folds the layers into a
    fresh dict once there are about sqrt(keys) of them: a lookup walks at most that many
    layers, and a `set` costs O(sqrt(keys)) amortised instead of a copy of every key
    (10,000 replicas that all failed once: the simulator's case).
    """

    __slots__ = ("_base", "_depth", "_key", "_parent", "_value")

    def __init__(self, items: Mapping[str, V] | None = None) -> None:
        self._base: dict[str, V] = dict(items or {})
        self._parent: Layers[V] | None = None
        self._key: str = ""
        self._value: V | None = None
        self._depth = 0

    def set(self, key: str, value: V) -> Self:
        """The same mapping with `key` set to `value`."""
        out = self.__class__.__new__(self.__class__)
        out._base, out._parent = self._base, self
        out._key, out._value, out._depth = key, value, self._depth + 1
        if out._depth >= max(8, isqrt(len(self._base))):  # layers ~ sqrt(keys): both cheap
            return self.__class__(out._merged())
        return out

    def __getitem__(self, key: str) -> V:
        node: Layers[V] | None = self
        while node is not None and node._depth:
            if node._key == key:
                return cast(V, node._value)
            node = node._parent
        return self._base[key]

    def _merged(self) -> dict[str, V]:
        layers: list[Layers[V]] = []
        node: Layers[V] | None = self
        while node is not None and node._depth:
            layers.append(node)
            node = node._parent
        merged = dict(self._base)
        for layer in reversed(layers):
            merged[layer._key] = cast(V, layer._value)
        return merged

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._merged()!r})"


class Tally(Layers[int]):
    """Counts per key (same errors per replica and fingerprint)."""

    __slots__ = ()

    def plus(self, key: str) -> Tally:
        """The same counts with `key` one higher."""
        return self.set(key, self.get(key, 0) + 1)


@dataclass(frozen=True)
class Occurrence:
    """Where a failure with a given fingerprint was last seen: the history rule's memory."""

    attempt: int
    restart: int
    progress: int | None  # the step the job had reached; None: no step known
    uptime_s: float | None  # how long the failing replica had run

    def where(self) -> str:
        if self.restart:
            return f"attempt {self.attempt} (restart {self.restart})"
        return f"attempt {self.attempt}"


@dataclass(frozen=True)
class Budgets:
    """What a job has used so far (a value: recording a failure makes a new one)."""

    job_restarts: int = 0
    # restarts alone in the current attempt, per replica (and per group, "group-<g>")
    replica_restarts: dict[str, int] = field(default_factory=dict)
    class_restarts: dict[str, int] = field(default_factory=dict)
    same_error: Tally = field(default_factory=Tally)  # "replica:fingerprint" -> count
    failed_replicas: frozenset[str] = frozenset()
    seen: Layers[Occurrence] = field(default_factory=Layers)  # fingerprint -> last occurrence
    # Outage retries in a row (`policy.backoff`), and the last step known at one of them.
    outage_streak: int = 0
    outage_progress: int | None = None

    def after(self, failure: Failure, decision: object) -> Budgets:
        """The budgets once `failure` happened and `decision` (a value of
        `trainguard.policy.decisions`, with the `charges` it makes) was taken on it.

        Built in one step (no `dataclasses.replace` per charge): the simulator calls
        this millions of times.
        """
        key, replica, failed = failure.same_error_key, failure.replica, self.failed_replicas
        job, alone, classes = self.job_restarts, self.replica_restarts, self.class_restarts
        for c in getattr(decision, "charges", ()):
            if c.budget == "job_restarts":
                # a new attempt: every replica gets its own restarts back (the Vertex rule)
                job, alone = c.used, {}
            elif c.budget.startswith(("replica_restarts:", "group_restarts:")):
                alone = {**alone, c.budget.split(":", 1)[1]: c.used}
            elif not c.budget.startswith("same_error:"):
                classes = {**classes, c.budget: c.used}
        streak = getattr(decision, "backoff_step", 0)  # 0: not an outage's retry
        step = failure.progress
        if step is None and streak > 1:
            step = self.outage_progress
        return Budgets(
            job_restarts=job,
            replica_restarts=alone,
            class_restarts=classes,
            same_error=self.same_error.plus(key),
            failed_replicas=failed if replica in failed else failed | {replica},
            seen=self.seen.set(failure.classification.fingerprint or "", failure.occurrence()),
            outage_streak=streak,
            outage_progress=step if streak else None,
        )
