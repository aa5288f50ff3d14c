"""What training code calls to talk to the trainguard master. Standard library only.

    from trainguard import sdk

    sdk.heartbeat(step)                       # alive, at this step
    with sdk.hang_detect(180): ...            # 180 s without a heartbeat here is a hang
    @sdk.hang_detect(-1)                      # e.g. a long checkpoint: hang detection off
    sdk.set_retryable_errors([r"NCCL timeout"])
    sdk.send_custom_message("eval loss 1.72")
    sdk.snapshot({"model": model.state_dict()}, step)  # in memory, each step: cheap
    restored = sdk.load_snapshot()            # (step, state) after a restart, or None

The master sets TRAINGUARD_MASTER_URL, TRAINGUARD_TOKEN and TRAINGUARD_REPLICA for each
replica. Without them every call does nothing (one SdkWarning per process; `enabled()`
tells), so the same script runs outside trainguard. A master that is down or refuses a
message never raises into training code: the SDK warns once and drops the message. Wrong
arguments do raise (TypeError, ValueError): they are bugs in the caller, not job faults.

The import must take milliseconds: http.client and json load on the first message sent,
and nothing here needs more than the standard library. The connection is `channel`'s;
checkpoints and snapshots are `state`'s (their files `trainguard.storage`'s, which the
master shares, as it shares the environment names in `storage.env`); the messages and
hang scopes are here.
"""

from __future__ import annotations

import functools
import math
import os

from trainguard.sdk import channel, state
from trainguard.sdk.channel import SdkWarning, enabled
from trainguard.sdk.state import (
    get_checkpoint,
    load_snapshot,
    mark_checkpoint_bad,
    report,
    snapshot,
)
from trainguard.storage.env import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_FAULTHANDLER_FILE,
    ENV_MASTER_URL,
    ENV_REPLICA,
    ENV_SNAPSHOT_DIR,
    ENV_SNAPSHOT_PERSIST_EVERY,
    ENV_TOKEN,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, ParamSpec, TypeVar

    P = ParamSpec("P")
    R = TypeVar("R")

__all__ = [
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_DIR",
    "ENV_FAULTHANDLER_FILE",
    "ENV_MASTER_URL",
    "ENV_REPLICA",
    "ENV_SNAPSHOT_DIR",
    "ENV_SNAPSHOT_PERSIST_EVERY",
    "ENV_TOKEN",
    "HANG_DETECT_OFF",
    "SdkWarning",
    "enabled",
    "get_checkpoint",
    "hang_detect",
    "heartbeat",
    "load_snapshot",
    "mark_checkpoint_bad",
    "preempted",
    "report",
    "send_custom_message",
    "set_hang_interval",
    "set_retryable_errors",
    "snapshot",
]

HANG_DETECT_OFF = -1
"""`hang_detect(HANG_DETECT_OFF)`: no hang detection inside the scope."""

_base_seconds: float | None = None
"""The interval outside every hang_detect scope (`set_hang_interval`); None: the job's."""
_scopes: list[hang_detect] = []
"""The active hang_detect scopes of this process, innermost last (guarded by the
connection's lock: scope changes reach the master in order)."""
_faulthandler_file: IO[str] | None = None
"""Kept open for the life of the process: faulthandler writes to its descriptor."""


def preempted() -> str | None:
    """The master's notice that the job is about to be stopped (a Slurm preemption or time
    limit warning, `sbatch --signal=B:USR1@120`), once an SDK call brought it: checkpoint
    now. None until then, and outside trainguard."""
    return channel.PREEMPTED[0] if channel.PREEMPTED else None


def heartbeat(step: int | None = None) -> None:
    """Tell the master this replica is alive (and, optionally, at which training step)."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"step: expected a non-negative int or None, got {step!r}")
    channel.post("/v1/heartbeat", {"step": step})


def set_retryable_errors(patterns: list[str]) -> bool:
    """Failures whose log matches one of these regexes (or keywords) are retried.
    True once the master has them (else they are sent with the next message)."""
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"patterns: expected a list of strings, got {patterns!r}")
    return channel.post("/v1/retryable_errors", {"patterns": list(patterns)})


def send_custom_message(text: str) -> bool:
    """A line for the job's record and notifications (e.g. "eval loss 1.72"); True when
    it reached the master."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a string, got {text!r}")
    return channel.post("/v1/message", {"text": text})


class hang_detect:  # lower case: it reads like a function, `with sdk.hang_detect(180):`
    """Within this scope, no heartbeat for `seconds` means a hang; -1 turns detection off.

    A context manager and a decorator. Scopes nest per process (across threads): on
    entry and exit the master is told the innermost active value, or null when none is.
    """

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise TypeError(f"seconds: expected a number, got {seconds!r}")
        if seconds != HANG_DETECT_OFF and not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds: expected > 0 or {HANG_DETECT_OFF} (off), got {seconds}")
        self.seconds = seconds

    def __enter__(self) -> None:
        with channel.lock():
            _scopes.append(self)
            _post_scope()

    def __exit__(self, *exc_info: object) -> None:
        with channel.lock():
            # By identity, not position: another thread may have entered a scope since.
            for i in range(len(_scopes) - 1, -1, -1):
                if _scopes[i] is self:
                    del _scopes[i]
                    break
            _post_scope()

    def __call__(self, func: Callable[P, R]) -> Callable[P, R]:
        seconds = self.seconds

        @functools.wraps(func)
        def scoped(*args: P.args, **kwargs: P.kwargs) -> R:
            with hang_detect(seconds):
                return func(*args, **kwargs)

        return scoped


def set_hang_interval(seconds: float | None) -> bool:
    """The hang interval outside every `hang_detect` scope, until changed: no heartbeat or
    output for `seconds` is a hang; -1 turns detection off; None gives the job's back.
    (AIMaster's `reset_config(job_hang_interval=...)`.)"""
    global _base_seconds
    if seconds is not None:
        hang_detect(seconds)  # validates
    with channel.lock():
        _base_seconds = seconds
        return _post_scope()


def _post_scope() -> bool:
    client = channel.get_client()
    if client is None:
        channel.warn_outside()
        return False
    seconds = _scopes[-1].seconds if _scopes else _base_seconds
    return client.post("/v1/hang_detect", {"seconds": seconds})


def _register_faulthandler() -> None:
    """Let SIGUSR2 dump all threads' stacks to a file the master reads (py-spy's fallback)."""
    global _faulthandler_file
    path = os.environ.get(ENV_FAULTHANDLER_FILE)
    if not path or not enabled():
        return
    import faulthandler
    import signal

    if not hasattr(signal, "SIGUSR2"):
        return
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        fd = os.open(path, flags, 0o600)  # under the job's private folder: private too
        _faulthandler_file = os.fdopen(fd, "a", encoding="utf-8")  # kept open
    except OSError as exc:
        channel.warn_once(
            "faulthandler", f"trainguard.sdk: cannot open {path} for stack dumps: {exc}"
        )
        return
    faulthandler.register(signal.SIGUSR2, file=_faulthandler_file, all_threads=True, chain=False)
    channel.post("/v1/faulthandler", {})


def _after_fork_in_child() -> None:
    channel.after_fork_in_child()
    state.after_fork_in_child()


def _reset_for_tests() -> None:
    """Forget the connection, the environment read, the warnings given, the scopes and
    the snapshot files."""
    global _base_seconds
    with channel.lock():
        channel.reset_for_tests()
        state.reset_for_tests()
        _scopes.clear()
        _base_seconds = None


os.register_at_fork(after_in_child=_after_fork_in_child)
_register_faulthandler()
