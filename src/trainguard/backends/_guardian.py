"""A tiny watchdog process: when the master dies, even by SIGKILL, no replica survives it.

The master writes `+PGID` / `-PGID` lines on the guardian's stdin as replica process
groups come and go. When stdin reaches EOF (the master is gone, whatever the cause),
the guardian SIGKILLs every group still listed. Replicas also carry PR_SET_PDEATHSIG,
but that reaches only the direct child; the guardian reaches the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

_SCRIPT = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
groups = set()
for line in sys.stdin:
    line = line.strip()
    if line.startswith("+"):
        groups.add(int(line[1:]))
    elif line.startswith("-"):
        groups.discard(int(line[1:]))
for g in groups:
    try:
        os.killpg(g, signal.SIGKILL)
    except OSError:
        pass
"""


class Guardian:
    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl+C in the terminal must not reach it
            text=True,
        )

    def _send(self, line: str) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(line + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        if self._proc.stdin and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
