"""The stacks of a hung job's replicas, as frozen values stored as JSON through
`to_dict()` / `from_dict()`: frames, threads, one replica's stacks, groups of identical
stacks, each replica's diagnosis and the report over all of them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

State = Literal["communication", "computation", "unknown"]
_STATES: tuple[State, ...] = ("communication", "computation", "unknown")
MAIN_THREAD = "MainThread"


@dataclass(frozen=True)
class Frame:
    name: str
    filename: str
    line: int | None
    native: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Frame:
        line = d.get("line")
        return cls(
            str(d["name"]),
            str(d["filename"]),
            None if line is None else int(line),
            bool(d["native"]),
        )


@dataclass(frozen=True)
class ThreadStack:
    thread_id: int
    thread_name: str | None
    active: bool
    frames: tuple[Frame, ...]  # innermost first, as py-spy and faulthandler give them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThreadStack:
        name = d.get("thread_name")
        frames = tuple(Frame.from_dict(f) for f in d["frames"])
        return cls(
            int(d["thread_id"]), None if name is None else str(name), bool(d["active"]), frames
        )


@dataclass(frozen=True)
class ReplicaStacks:
    replica: str
    rank: int
    pid: int
    tool: str  # "py-spy --native", "py-spy", "faulthandler", or "none"
    ok: bool
    error: str | None
    duration_ms: float
    threads: tuple[ThreadStack, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplicaStacks:
        error = d.get("error")
        return cls(
            replica=str(d["replica"]),
            rank=int(d["rank"]),
            pid=int(d["pid"]),
            tool=str(d["tool"]),
            ok=bool(d["ok"]),
            error=None if error is None else str(error),
            duration_ms=float(d["duration_ms"]),
            threads=tuple(ThreadStack.from_dict(t) for t in d["threads"]),
        )


@dataclass(frozen=True)
class StackGroup:
    frames: tuple[Frame, ...]  # the first member's stack (its line numbers)
    members: tuple[tuple[str, int], ...]  # (replica, thread_id)
    count: int
    replicas: tuple[str, ...]
    unique: bool  # one replica alone has this stack while two or more were dumped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StackGroup:
        return cls(
            frames=tuple(Frame.from_dict(f) for f in d["frames"]),
            members=tuple((str(r), int(t)) for r, t in d["members"]),
            count=int(d["count"]),
            replicas=tuple(str(r) for r in d["replicas"]),
            unique=bool(d["unique"]),
        )


@dataclass(frozen=True)
class ReplicaDiagnosis:
    replica: str
    rank: int
    state: State
    culprit: bool
    reason: str
    main_stack: tuple[Frame, ...]
    pace: str | None  # "stuck" / "slow" / "ok" from heartbeats, when known (`stragglers`)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplicaDiagnosis:
        state = str(d["state"])
        if state not in _STATES:
            raise ValueError(f"ReplicaDiagnosis.state: {state!r} is not one of {_STATES}")
        pace = d.get("pace", d.get("progress"))  # "progress": as stored before issue 39
        return cls(
            replica=str(d["replica"]),
            rank=int(d["rank"]),
            state=state,
            culprit=bool(d["culprit"]),
            reason=str(d["reason"]),
            main_stack=tuple(Frame.from_dict(f) for f in d["main_stack"]),
            pace=None if pace is None else str(pace),
        )


@dataclass(frozen=True)
class StackReport:
    groups: tuple[StackGroup, ...]
    replicas: tuple[ReplicaDiagnosis, ...]
    culprits: tuple[str, ...]
    summary: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StackReport:
        return cls(
            groups=tuple(StackGroup.from_dict(g) for g in d["groups"]),
            replicas=tuple(ReplicaDiagnosis.from_dict(r) for r in d["replicas"]),
            culprits=tuple(str(c) for c in d["culprits"]),
            summary=str(d["summary"]),
        )
