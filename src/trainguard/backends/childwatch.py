"""Exits of the loop's child processes from pidfds on the loop, not one thread each.

Python 3.11's default child watcher (ThreadedChildWatcher) runs one thread per child
process, blocked in waitpid(): 257 threads for 256 replicas, and one per job's master in
the server. From 3.12 on a pidfd watcher is already the default (and child watchers are
deprecated), so `pidfd_child_watcher` does nothing there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVarTuple

_Ts = TypeVarTuple("_Ts")

if sys.version_info < (3, 12):  # child watchers are deprecated in 3.12, gone in 3.14

    class _PidfdWatcher(asyncio.AbstractChildWatcher):
        """Exits of one loop's children from pidfds on that loop (Python 3.11).

        What 3.11's PidfdChildWatcher does, plus: a child it cannot open a pidfd for (EMFILE,
        or pidfd_open refused by a seccomp filter) gets a waitpid() thread instead, where the
        stock watcher would raise after the process exists; and the children still running
        when the watcher is put away are handed over, not dropped.
        """

        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            self._loop = loop
            self._children: dict[int, tuple[int, Callable[..., object], tuple[Any, ...]]] = {}
            self._threads = asyncio.ThreadedChildWatcher()

        def add_child_handler(
            self, pid: int, callback: Callable[[int, int, *_Ts], object], *args: *_Ts
        ) -> None:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                self._threads.add_child_handler(pid, callback, *args)
                return
            self._loop.add_reader(pidfd, self._exited, pid)
            self._children[pid] = (pidfd, callback, args)

        def _exited(self, pid: int) -> None:
            pidfd, callback, args = self._children.pop(pid)
            self._loop.remove_reader(pidfd)
            os.close(pidfd)
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:  # reaped by someone else: what asyncio reports then
                code = 255
            else:
                code = os.waitstatus_to_exitcode(status)
            callback(pid, code, *args)

        def remove_child_handler(self, pid: int) -> bool:
            child = self._children.pop(pid, None)
            if child is None:
                return False
            self._loop.remove_reader(child[0])
            os.close(child[0])
            return True

        def hand_over(self, to: asyncio.AbstractChildWatcher) -> None:
            """Let `to` watch the children still running (call it from the running loop)."""
            for pid, (_, callback, args) in list(self._children.items()):
                self.remove_child_handler(pid)
                to.add_child_handler(pid, callback, *args)

        def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
            pass  # bound to its loop for good

        def is_active(self) -> bool:
            return self._loop.is_running()

        def close(self) -> None:
            for pid in list(self._children):
                self.remove_child_handler(pid)

        def __enter__(self) -> _PidfdWatcher:
            return self

        def __exit__(self, *exc: object) -> None:
            pass


def _pidfd_usable() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3, or seccomp
        return False
    return True


@contextlib.contextmanager
def pidfd_child_watcher(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Learn the exits of this loop's children from pidfds on the loop, not threads.

    Python 3.11's default child watcher (ThreadedChildWatcher) runs one thread per child
    process, blocked in waitpid(): 257 threads for 256 replicas. A PidfdChildWatcher
    adds one fd per child to the loop's selector instead. From 3.12 on it is already
    the default where pidfds work (and child watchers are deprecated), so this does
    nothing there. The watcher is process-wide (the event loop policy's), so it is set
    only from the main thread, only over the default one, and put back on the way out,
    children still running included (handed to the default watcher).
    """
    if (
        sys.version_info >= (3, 12)
        or sys.platform != "linux"
        or threading.current_thread() is not threading.main_thread()
        or not _pidfd_usable()
    ):
        yield
        return
    policy = asyncio.get_event_loop_policy()
    previous = policy.get_child_watcher()
    if not isinstance(previous, asyncio.ThreadedChildWatcher):  # someone chose one
        yield
        return
    watcher = _PidfdWatcher(loop)
    policy.set_child_watcher(watcher)  # closes `previous`, which it keeps usable
    try:
        yield
    finally:
        watcher.hand_over(previous)
        policy.set_child_watcher(previous)
