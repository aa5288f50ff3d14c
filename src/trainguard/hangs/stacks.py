"""Stacks of a hung job's replicas: parse them, group identical ones, name the culprit.

A hung collective looks the same on every rank that reached it; the rank that never
arrived is the odd one out. So every replica's stacks are dumped (stack_dumps.py does that
I/O), identical stacks are grouped, and the main threads are compared. Everything here is a
pure function over frozen values, stored as JSON through `to_dict()` / `from_dict()`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from trainguard.classify.logtail import printable
from trainguard.hangs.stack_model import (
    MAIN_THREAD,
    Frame,
    ReplicaDiagnosis,
    ReplicaStacks,
    StackGroup,
    StackReport,
    State,
    ThreadStack,
)

# What waiting inside communication looks like. A frame is a communication frame when
# its name matches _COLLECTIVE_NAMES or its file matches _COLLECTIVE_FILES. The names
# cover the native view (py-spy --native) of c10d, gloo, NCCL and MPI, and the Python
# names of the collectives; the files cover torch.distributed's Python layer and the
# communication libraries. `broadcast_tensors/_shapes/_to` are tensor ops, not collectives.
_COLLECTIVE_NAMES = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"c10d",  # c10d::Reducer::finalize_backward, c10d::ProcessGroupGloo, _c10d_functional
        r"ProcessGroup",  # ProcessGroupGloo / NCCL / MPI and their Work objects
        r"gloo::",
        r"nccl",  # ncclAllReduce, ProcessGroupNCCL::WorkNCCL::wait
        r"Reducer::",  # DDP's gradient-bucket reducer (finalize_backward waits for all-reduce)
        r"Work(::|\.)(wait|synchronize|result)",  # waiting on an async collective's Work
        r"wait_tensor",  # functional collectives
        r"(^|[^a-z])all_?reduce",
        r"(^|[^a-z])reduce_?scatter",
        r"(^|[^a-z])all_?gather",
        r"(^|[^a-z])all_?to_?all",
        r"(^|[^a-z])barrier",
        r"(^|[^a-z])broadcast(?!_(tensors|shapes|to)\b)",
        r"\bP?MPI_",
    )
)
_COLLECTIVE_FILES = tuple(
    re.compile(p)
    for p in (
        r"torch/distributed/",
        r"lib(nccl|gloo|mpi)[^/]*$",
        r"mpi4py/",
        r"deepspeed/comm/",
        r"horovod/",
    )
)
_THIRD_PARTY = re.compile(r"[/\\](site|dist)-packages[/\\]")
_GIL_WAIT = re.compile(r"gil_scoped_acquire|take_gil|PyEval_AcquireThread|PyGILState_Ensure")


def exit_deadlock(snap: ReplicaStacks) -> bool:
    """torch's deadlock at a gloo group's teardown (pytorch/pytorch#56297): the main
    thread joins gloo's workers in ~ProcessGroupGloo holding the GIL, while a worker waits
    for the GIL to free its last work. Native frames only show it (py-spy --native)."""
    if not snap.ok or not snap.threads:
        return False
    main = _main_thread(snap.threads)
    if not any(f.native and "~ProcessGroupGloo" in f.name for f in main.frames):
        return False
    return any(
        t is not main
        and any(f.native and _GIL_WAIT.search(f.name) for f in t.frames)
        and any(f.native and "ProcessGroupGloo" in f.name for f in t.frames)
        for t in snap.threads
    )


def _is_collective(frame: Frame) -> bool:
    return any(p.search(frame.name) for p in _COLLECTIVE_NAMES) or any(
        p.search(frame.filename) for p in _COLLECTIVE_FILES
    )


def in_collective(thread: ThreadStack) -> bool:
    """True when the thread waits inside communication.

    Frames are read innermost first: native frames that match nothing (pthread and
    condition-variable waits, autograd plumbing) are skipped, a communication frame
    answers yes, and the first Python frame that is not one answers no. So a rank that
    computes in model code called from FSDP (torch/distributed/) counts as computing.
    """
    for frame in thread.frames:
        if _is_collective(frame):
            return True
        if not frame.native:
            return False
    return False


def _main_thread(threads: Sequence[ThreadStack]) -> ThreadStack:
    for t in threads:
        if t.thread_name == MAIN_THREAD:
            return t
    return next((t for t in threads if t.active), threads[0])


def _basename(path: str) -> str:
    return re.split(r"[/\\]", path)[-1]


def _frame_key(f: Frame) -> tuple[str, str, int | None]:
    # Line numbers matter in the user's own code (two calls of all_reduce on different
    # lines are different collectives), not inside libraries or native code.
    own = not f.native and not _THIRD_PARTY.search(f.filename)
    return (f.name, _basename(f.filename), f.line if own else None)


def _stack_key(frames: Sequence[Frame]) -> tuple[tuple[str, str, int | None], ...]:
    return tuple(_frame_key(f) for f in frames)


def _python_key(frames: Sequence[Frame]) -> tuple[tuple[str, str, int | None], ...]:
    """Key of the Python frames: ranks in one collective agree on them even when their
    native waits differ, or when one rank's native dump failed and fell back."""
    py = [f for f in frames if not f.native]
    return _stack_key(py if py else frames)


def _innermost_python(frames: Sequence[Frame]) -> Frame | None:
    return next((f for f in frames if not f.native), frames[0] if frames else None)


def _collective_frame(frames: Sequence[Frame]) -> Frame | None:
    by_name = (f for f in frames if any(p.search(f.name) for p in _COLLECTIVE_NAMES))
    return next(by_name, next((f for f in frames if _is_collective(f)), None))


def _where(frame: Frame | None) -> str:
    if frame is None:
        return "an empty stack"
    if frame.native:
        return frame.name  # a qualified C++ name says enough; the library adds noise
    line = "" if frame.line is None else f":{frame.line}"
    return f"{frame.name} ({_basename(frame.filename)}{line})"


class _Judged(NamedTuple):
    state: State
    main: tuple[Frame, ...]
    what: str  # what the main thread does, in words


def _judge_one(snap: ReplicaStacks) -> _Judged:
    """Inside torch/autograd with Python frames only, a rank may compute or wait for DDP's
    gradient all-reduce (its hook runs in C++): "unknown" unless native frames show which."""
    if not snap.ok:
        return _Judged("unknown", (), f"stack dump failed: {snap.error or 'no reason given'}")
    if not snap.threads:
        return _Judged("unknown", (), "no Python thread in the stack dump")
    main = _main_thread(snap.threads).frames
    if in_collective(ThreadStack(0, None, False, main)):
        return _Judged("communication", main, f"waits in {_where(_collective_frame(main))}")
    inner = _innermost_python(main)
    if inner and "torch/autograd/" in inner.filename and not any(f.native for f in main):
        why = (
            f"in autograd backward, {_where(inner)}; Python frames alone cannot tell "
            "computation from DDP's gradient all-reduce: dump with native frames"
        )
        return _Judged("unknown", main, why)
    return _Judged("computation", main, f"computes in {_where(inner)}")


def _peers(n: int) -> str:
    return f"{n} peer waits" if n == 1 else f"{n} peers wait"


def _names(replicas: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(replicas[:limit])
    return shown if len(replicas) <= limit else f"{shown}, … (+{len(replicas) - limit})"


def aggregate(
    stacks: Sequence[ReplicaStacks], pace: Mapping[str, str] | None = None
) -> StackReport:
    """Group identical stacks across replicas and threads; name the likely culprit.

    Each replica's state comes from its main thread (see `in_collective`). Rules, first
    match wins: (0) a replica deadlocked in torch's gloo teardown (`exit_deadlock`) is the
    culprit, whatever the others do. (1) some wait in communication and others compute:
    the computing ones are culprits. (2) None computes, and of three or more in
    communication exactly one sits in a different collective: that one. (3) `pace`
    (replica -> "stuck" / "slow" / "ok", from heartbeats) names stuck replicas: those.
    (4) No culprit.
    """
    pace = pace or {}
    snaps = sorted(stacks, key=lambda s: (s.rank, s.replica))
    judged = {s.replica: _judge_one(s) for s in snaps}
    culprits, reasons, summary = _culprits(snaps, judged, pace)
    diagnoses = tuple(
        ReplicaDiagnosis(
            replica=s.replica,
            rank=s.rank,
            state=judged[s.replica].state,
            culprit=s.replica in culprits,
            reason=reasons.get(s.replica, judged[s.replica].what),
            main_stack=judged[s.replica].main,
            pace=pace.get(s.replica),
        )
        for s in snaps
    )
    groups = _group([s for s in snaps if s.ok])
    # The culprits' main stacks first, then other main threads, then helper threads.
    mains = {(s.replica, _main_thread(s.threads).thread_id) for s in snaps if s.threads}
    groups.sort(key=lambda g: (not _holds_culprit(g, diagnoses), not mains.intersection(g.members)))
    return StackReport(tuple(groups), diagnoses, tuple(culprits), summary)


def _culprits(
    snaps: Sequence[ReplicaStacks], judged: Mapping[str, _Judged], pace: Mapping[str, str]
) -> tuple[list[str], dict[str, str], str]:
    """(culprits, reason of each, one-line summary) by the rules of `aggregate`."""
    if deadlocked := [s.replica for s in snaps if exit_deadlock(s)]:
        who = f"{deadlocked[0]} is" if len(deadlocked) == 1 else f"{_names(deadlocked)} are"
        summary = (
            f"deadlock in torch: {who} stuck destroying a gloo process group: the main thread "
            "joins gloo's worker threads in ~ProcessGroupGloo holding the GIL, which a worker "
            "needs to free its last work (pytorch/pytorch#56297; seen with torch._dynamo or "
            "FSDP imported before init_process_group)"
        )
        reason = "deadlocked in ~ProcessGroupGloo: it holds the GIL a gloo worker waits for"
        return deadlocked, dict.fromkeys(deadlocked, reason), summary
    comm = [s.replica for s in snaps if judged[s.replica].state == "communication"]
    comp = [s.replica for s in snaps if judged[s.replica].state == "computation"]
    if comm and comp:
        waits = Counter(_where(_collective_frame(judged[r].main)) for r in comm)
        lead = comp[0]
        who = f"{lead} is" if len(comp) == 1 else f"{_names(comp)} are"
        summary = (
            f"computation hang: {who} stuck outside any collective in "
            f"{_where(_innermost_python(judged[lead].main))} while {_peers(len(comm))} in "
            f"{waits.most_common(1)[0][0]}"
        )
        reason = f"waits outside any collective while {_peers(len(comm))} inside one"
        return comp, dict.fromkeys(comp, reason), summary
    in_backward = [r for r in judged if judged[r].what.startswith("in autograd")]
    if comp and in_backward and not comm and len(comp) + len(in_backward) == len(snaps):
        lead = comp[0]
        who = f"{lead} is" if len(comp) == 1 else f"{_names(comp)} are"
        summary = (
            f"likely computation hang: {who} outside torch in "
            f"{_where(_innermost_python(judged[lead].main))} while {_peers(len(in_backward))} "
            "in backward, where DDP waits for the gradient all-reduce (no native frames to "
            "confirm it)"
        )
        reason = f"outside torch while {_peers(len(in_backward))} in backward (likely)"
        return comp, dict.fromkeys(comp, reason), summary
    if len(comm) >= 3 and not comp and (odd := _odd_one_out({r: judged[r].main for r in comm})):
        other = next(r for r in comm if r != odd)
        summary = (
            f"collective mismatch: {odd} is the only rank in a different collective, "
            f"{_where(_collective_frame(judged[odd].main))}, while {_peers(len(comm) - 1)} in "
            f"{_where(_collective_frame(judged[other].main))}"
        )
        return [odd], {odd: "the only rank in a different collective"}, summary
    if stuck := [s.replica for s in snaps if pace.get(s.replica) == "stuck"]:
        who = f"{stuck[0]} is" if len(stuck) == 1 else f"{_names(stuck)} are"
        summary = (
            f"stalled replica: {who} behind by heartbeats; stacks do not single it out "
            f"({stuck[0]} {judged[stuck[0]].what})"
        )
        reason = "its heartbeats stopped advancing while its peers' did (pace: stuck)"
        return stuck, dict.fromkeys(stuck, reason), summary
    if not snaps:
        return [], {}, "no culprit: no replica's stacks were dumped"
    if len(comm) == len(snaps) and len({_python_key(judged[r].main) for r in comm}) == 1:
        where = _where(_collective_frame(judged[comm[0]].main))
        return [], {}, f"no culprit: all {len(comm)} ranks wait in the same collective, {where}"
    unknown = len(snaps) - len(comm) - len(comp)
    summary = (
        f"no culprit: {len(comm)} in communication, {len(comp)} in computation, {unknown} unknown"
    )
    hint = next((j.what for j in judged.values() if j.what.startswith("in autograd")), None)
    return [], {}, summary + (f"; {hint}" if hint else "")


def _odd_one_out(mains: Mapping[str, Sequence[Frame]]) -> str | None:
    by_key: dict[object, list[str]] = {}
    for replica, frames in mains.items():
        by_key.setdefault(_python_key(frames), []).append(replica)
    if len(by_key) != 2:
        return None
    small, big = sorted(by_key.values(), key=len)
    return small[0] if len(small) == 1 and len(big) >= 2 else None


def _holds_culprit(group: StackGroup, diagnoses: Sequence[ReplicaDiagnosis]) -> bool:
    """The group holds a culprit's main thread (not merely one of its helper threads)."""
    key = _stack_key(group.frames)
    return any(
        d.culprit and d.replica in group.replicas and _stack_key(d.main_stack) == key
        for d in diagnoses
    )


def _group(snaps: Sequence[ReplicaStacks]) -> list[StackGroup]:
    keyed: dict[object, tuple[tuple[Frame, ...], list[tuple[str, int]]]] = {}
    for s in snaps:
        for t in s.threads:
            keyed.setdefault(_stack_key(t.frames), (t.frames, []))[1].append(
                (s.replica, t.thread_id)
            )
    groups: list[StackGroup] = []
    for frames, members in keyed.values():
        replicas = tuple(dict.fromkeys(r for r, _ in members))
        unique = len(replicas) == 1 and len(snaps) >= 2
        groups.append(StackGroup(frames, tuple(members), len(members), replicas, unique))
    # Most shared first; the order of first appearance breaks ties.
    return sorted(groups, key=lambda g: -g.count)


# -- rendering -------------------------------------------------------------------------


def render(report: StackReport) -> str:
    """Human text for `trainguard stacks`: summary, replicas, then groups (innermost first).

    Names and paths come from the replicas' processes: their control characters are
    escaped, shown on the terminal and never obeyed.
    """
    out = [report.summary, "", "replicas:"]
    width = max((len(d.replica) for d in report.replicas), default=0)
    for d in report.replicas:
        mark = ">>> culprit: " if d.culprit else ""
        prog = f" [{d.pace}]" if d.pace else ""
        out.append(f"  {d.replica:<{width}}  rank {d.rank:<3} {d.state:<13} {mark}{d.reason}{prog}")
    for g in report.groups:
        marked = _holds_culprit(g, report.replicas)
        threads = f"{g.count} thread{'s' if g.count != 1 else ''}"
        label = f"{'>>> culprit  ' if marked else ''}{threads} in {len(g.replicas)} replica"
        label += "s" if len(g.replicas) != 1 else ""
        out += ["", f"{label}{' (unique)' if g.unique else ''}: {_names(g.replicas)}"]
        for f in g.frames:
            if f.native:
                out.append(f"    {f.name}  [native {_basename(f.filename)}]")
            else:
                out.append(
                    f"    {f.name}  {_short(f.filename)}:{'?' if f.line is None else f.line}"
                )
    return printable("\n".join(out))


def _short(path: str) -> str:
    """A site-packages path from the package on (torch/autograd/graph.py); others as is."""
    m = _THIRD_PARTY.search(path)
    return path[m.end() :] if m else path
