"""Take every replica's stack before a hung job is killed, all at once and time-bounded.

py-spy reads a process's stacks from outside (ptrace), so it works even when the
process is stuck in C code holding the GIL. When it is missing or cannot attach, a
replica that registered `faulthandler.register(SIGUSR2, file=..., all_threads=True)`
is asked to dump its own stacks. A dump that fails or times out is recorded as
such: diagnosis must never hold up recovery, nor raise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trainguard.hangs.stack_model import ReplicaStacks, ThreadStack
from trainguard.hangs.stack_parsers import parse_faulthandler, parse_py_spy_json

FAULTHANDLER_POLL_S = 0.02
"""How often the faulthandler file is checked for the dump to arrive and settle."""

FALLBACK_S = 1.0
"""The time kept for each fallback still to come. A plain dump takes ~10 ms; a native one
reads libtorch's symbols (0.8 s idle, over 3 s on a busy machine), so it gets the rest."""


class _Failed(Exception):
    """One attempt failed; the message says why, in one line."""


def find_py_spy() -> str | None:
    """py-spy on PATH, else next to this interpreter (a virtual environment's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


async def dump_stacks(
    targets: Sequence[tuple[str, int, int]],
    *,
    timeout_s: float = 10.0,
    native: bool = True,
    faulthandler_files: Mapping[str, Path] | None = None,
    py_spy: str | None = None,
) -> list[ReplicaStacks]:
    """Snapshot every (replica, rank, pid) in parallel, each within `timeout_s`.

    Per target: `py-spy dump --json --native`, then without --native if that failed,
    then the faulthandler file if `faulthandler_files` names one; each attempt gets the
    time left less `FALLBACK_S` per attempt still to come (at least an equal share of
    it). `py_spy` is the
    binary to run (default: `find_py_spy()`). Results come in the order of `targets`.
    """
    binary = py_spy if py_spy is not None else find_py_spy()
    files = faulthandler_files or {}
    return list(
        await asyncio.gather(
            *(
                _dump_one(replica, rank, pid, binary, native, files.get(replica), timeout_s)
                for replica, rank, pid in targets
            )
        )
    )


async def _dump_one(
    replica: str,
    rank: int,
    pid: int,
    binary: str | None,
    native: bool,
    fh_file: Path | None,
    timeout_s: float,
) -> ReplicaStacks:
    start = time.monotonic()
    if pid <= 0:  # os.kill(0, ...) would signal our own process group
        return ReplicaStacks(replica, rank, pid, "none", False, f"no pid ({pid})", 0.0, ())
    deadline = start + timeout_s
    attempts: list[tuple[str, list[str]]] = []
    if binary is not None:
        base = [binary, "dump", "--pid", str(pid), "--json"]
        if process_state(pid) == "T":
            # Stopped (SIGSTOP, a debugger): py-spy cannot suspend it, but it can read it
            # without suspending; native frames need the suspension.
            attempts.append(("py-spy --nonblocking (process stopped)", [*base, "--nonblocking"]))
        else:
            if native:
                attempts.append(("py-spy --native", [*base, "--native"]))
            attempts.append(("py-spy", base))
    errors: list[str] = [] if binary is not None else ["py-spy: not found"]
    tool = "none"
    n_left = len(attempts) + (fh_file is not None)
    for tool, argv in attempts:
        share = _share(deadline - time.monotonic(), n_left)
        n_left -= 1
        try:
            threads = await _py_spy(argv, share)
        except _Failed as exc:
            errors.append(f"{tool}: {exc}")
            continue
        return _done(replica, rank, pid, tool, start, threads)
    if fh_file is not None:
        tool = "faulthandler"
        try:
            threads = await _faulthandler(pid, fh_file, deadline)
        except _Failed as exc:
            errors.append(f"faulthandler: {exc}")
        else:
            return _done(replica, rank, pid, tool, start, threads)
    return ReplicaStacks(replica, rank, pid, tool, False, "; ".join(errors), _ms(start), ())


def _share(left_s: float, n_left: int) -> float:
    """The time for this attempt out of `left_s`, with `n_left` attempts counting it."""
    return max(left_s - FALLBACK_S * (n_left - 1), left_s / n_left)


def process_state(pid: int) -> str | None:
    """The one-letter state of /proc/<pid>/stat: R, S, D, T (stopped), Z, ..."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _done(
    replica: str, rank: int, pid: int, tool: str, start: float, threads: tuple[ThreadStack, ...]
) -> ReplicaStacks:
    return ReplicaStacks(replica, rank, pid, tool, True, None, _ms(start), threads)


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000


async def _py_spy(argv: list[str], timeout_s: float) -> tuple[ThreadStack, ...]:
    """Run one py-spy dump; killed when it outlives `timeout_s`."""
    env = {**os.environ, "RUST_BACKTRACE": "0"}  # its errors without a Rust backtrace
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except OSError as exc:
        raise _Failed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), max(timeout_s, 0.0))
    except TimeoutError:
        raise _Failed(f"no answer within {timeout_s:.1f} s") from None
    finally:
        if proc.returncode is None:  # timed out, or the whole dump was cancelled
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        raise _Failed(_first_line(err.decode(errors="replace")) or f"exit {proc.returncode}")
    try:
        return parse_py_spy_json(out.decode(errors="replace"))
    except (ValueError, KeyError, TypeError) as exc:
        raise _Failed(f"unreadable output: {exc}") from None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):  # "Error: X" then "Caused by:" and its numbered causes
        if ln == "Caused by:" and i + 1 < len(lines):
            return f"{lines[0]} ({lines[i + 1].lstrip('0123456789: ')})"
    return lines[0] if lines else ""


def _catches(pid: int, signum: int) -> bool | None:
    """Does the process handle `signum`? None when /proc cannot tell."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return None


async def _faulthandler(pid: int, path: Path, deadline: float) -> tuple[ThreadStack, ...]:
    """Ask the replica to dump its stacks (SIGUSR2) and read what it appends to `path`.

    SIGUSR2 kills a process that did not register a handler, so it is sent only when
    /proc shows the signal caught (or cannot tell, and the file exists).
    """
    if not hasattr(signal, "SIGUSR2"):
        raise _Failed("no SIGUSR2 on this platform")
    catches = _catches(pid, signal.SIGUSR2)
    if catches is False or (catches is None and not path.exists()):
        raise _Failed("the process does not handle SIGUSR2 (faulthandler not registered)")
    before = _size(path)
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError as exc:
        raise _Failed(f"cannot signal pid {pid}: {exc.strerror or exc}") from None
    last = before
    while time.monotonic() < deadline:
        await asyncio.sleep(FAULTHANDLER_POLL_S)
        size = _size(path)
        if size > before and size == last:  # it grew, then settled for one poll
            break
        last = size
    if last <= before:
        raise _Failed(f"nothing written to {path} after SIGUSR2")
    with path.open("rb") as fh:
        fh.seek(before)
        threads = parse_faulthandler(fh.read().decode(errors="replace"))
    if not threads:
        raise _Failed(f"no stack found in what was written to {path}")
    return threads


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
