"""Parsers of the two stack formats trainguard reads: py-spy's JSON dump (with native
frames) and Python's faulthandler text (what a replica writes through the SDK)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from trainguard.hangs.stack_model import MAIN_THREAD, Frame, ThreadStack

_HEX = re.compile(r"0x[0-9a-fA-F]+")  # unsymbolised native frames (libc start-up noise)
_SHARED_LIB = re.compile(r"\.(so(\.\d+)*|dylib|dll|pyd)$")
_THREADING = re.compile(r"(^|[/\\])threading\.py$")
_FH_HEADER = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(.*)\])? \(most recent call first\):"
)
_FH_STACK = re.compile(r"^Stack \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


# -- parsing ---------------------------------------------------------------------------


def parse_py_spy_json(text: str) -> tuple[ThreadStack, ...]:
    """Threads of `py-spy dump --json [--native]`; raises ValueError on malformed input.

    py-spy leaves thread_name null when the process never imported threading; the thread
    whose OS id is the pid is then named MainThread, as it is the main thread on Linux.
    """
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("py-spy JSON: expected a list of threads")
    threads: list[ThreadStack] = []
    for t in data:
        frames = tuple(f for f in map(_py_spy_frame, t.get("frames") or ()) if f is not None)
        name = t.get("thread_name")
        if (
            name is None
            and t.get("os_thread_id") is not None
            and t.get("os_thread_id") == t.get("pid")
        ):
            name = MAIN_THREAD
        threads.append(ThreadStack(int(t["thread_id"]), name, bool(t.get("active")), frames))
    return tuple(threads)


def _py_spy_frame(raw: Mapping[str, Any]) -> Frame | None:
    name = str(raw.get("name") or "?")
    if _HEX.fullmatch(name):
        return None
    filename = str(raw.get("filename") or "")
    line = raw.get("line")
    # py-spy sets `module` (the shared library) on native frames only; line is then 0.
    native = bool(raw.get("module")) or not filename or bool(_SHARED_LIB.search(filename))
    return Frame(name, filename, None if native or not line else int(line), native)


def parse_faulthandler(text: str) -> tuple[ThreadStack, ...]:
    """Threads of `faulthandler.dump_traceback(all_threads=True)` text (the py-spy fallback).

    "Current thread" is the one that ran the handler (active). faulthandler prints no
    thread names, so the one thread not started by threading.py is named MainThread.
    When the text holds several dumps, the last one wins.
    """
    threads: list[tuple[int, str | None, bool, list[Frame]]] = []
    for raw_line in text.splitlines():
        header = _FH_HEADER.match(raw_line)
        if header or _FH_STACK.match(raw_line):
            tid = int(header.group(2), 16) if header else 0
            if any(t[0] == tid for t in threads):
                threads = []  # a later dump starts: keep only the last one
            name = header.group(3) if header else None
            threads.append((tid, name, header is None or header.group(1) == "Current thread", []))
            continue
        frame = _FH_FRAME.match(raw_line)
        if frame and threads:
            line = None if frame.group(2) == "???" else int(frame.group(2))
            threads[-1][3].append(Frame(frame.group(3), frame.group(1), line, False))
    stacks = [ThreadStack(tid, name, active, tuple(fr)) for tid, name, active, fr in threads]
    if not any(s.thread_name == MAIN_THREAD for s in stacks):
        mains = [
            i
            for i, s in enumerate(stacks)
            if s.frames and not _THREADING.search(s.frames[-1].filename)
        ]
        if len(mains) == 1:
            s = stacks[mains[0]]
            stacks[mains[0]] = ThreadStack(s.thread_id, MAIN_THREAD, s.active, s.frames)
    return tuple(stacks)
