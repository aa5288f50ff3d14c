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
and nothing here needs more than the standard library.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import time
import warnings
from pathlib import Path

TYPE_CHECKING = False
if TYPE_CHECKING:
    import http.client
    from collections.abc import Callable
    from typing import IO, ParamSpec, TypeVar

    from trainguard.records.snapshots import Writer

    P = ParamSpec("P")
    R = TypeVar("R")

ENV_MASTER_URL = "TRAINGUARD_MASTER_URL"
ENV_TOKEN = "TRAINGUARD_TOKEN"
ENV_REPLICA = "TRAINGUARD_REPLICA"
ENV_FAULTHANDLER_FILE = "TRAINGUARD_FAULTHANDLER_FILE"

HANG_DETECT_OFF = -1
"""`hang_detect(HANG_DETECT_OFF)`: no hang detection inside the scope."""

_TIMEOUT_S = 2.0
"""Per socket operation: a slow master must not stall a training step for long."""
_RETRY_AFTER_S = 5.0
"""After the master was unreachable, drop messages for this long instead of stalling each."""
_ATTEMPTS = 2
"""The first try, and one more on a fresh connection (the master may have closed an idle one)."""
_STATE_ROUTES = ("/v1/hang_detect", "/v1/retryable_errors", "/v1/faulthandler")
"""Messages that set state: the latest undelivered one is sent again once the master answers."""


class SdkWarning(UserWarning):
    """The SDK could not deliver (or was not asked to deliver) a message to the master."""


class _Client:
    """One persistent HTTP connection to the master. Callers hold `_lock`."""

    def __init__(self, host: str, port: int, prefix: str, token: str, replica: str) -> None:
        self.host, self.port, self.prefix, self.replica = host, port, prefix, replica
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}{prefix}"
        self._headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        self._conn: http.client.HTTPConnection | None = None
        self._quiet_until_s = 0.0
        self._stale: dict[str, dict[str, object]] = {}

    def post(self, route: str, fields: dict[str, object]) -> None:
        """Deliver undelivered state first, then this message; drop it if the master is gone."""
        if route in _STATE_ROUTES:
            self._stale[route] = fields
        if time.monotonic() < self._quiet_until_s:
            return
        for state_route in list(self._stale):
            if not self._send(state_route, self._stale[state_route]):
                return
            del self._stale[state_route]
        if route not in _STATE_ROUTES:
            self._send(route, fields)

    def _send(self, route: str, fields: dict[str, object]) -> bool:
        """False when the master could not be reached; a refusal counts as delivered."""
        import http.client
        import json

        body = json.dumps({"replica": self.replica, **fields}).encode()
        failure: Exception | None = None
        for _ in range(_ATTEMPTS):
            try:
                conn = self._connection()
                conn.request("POST", self.prefix + route, body, self._headers)
                response = conn.getresponse()
                answer = response.read()
            except TimeoutError as exc:  # a slow master: a second try would double the stall
                failure = exc
                self.close()
                break
            except (OSError, http.client.HTTPException) as exc:
                failure = exc
                self.close()
                continue
            if response.status == 200:
                _obey(answer)
            if response.status >= 400:
                _warn_once(
                    "refused",
                    f"trainguard.sdk: the master refused {route} with {response.status} "
                    f"{answer.decode(errors='replace').strip()}; such messages are dropped",
                )
            return True
        self._quiet_until_s = time.monotonic() + _RETRY_AFTER_S
        _warn_once(
            "unreachable",
            f"trainguard.sdk: the master at {self.url} is unreachable ({failure!r}); "
            "messages are dropped while it is",
        )
        return False

    def _connection(self) -> http.client.HTTPConnection:
        import http.client

        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=_TIMEOUT_S)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_lock = threading.Lock()
"""Guards the state below and the connection: scope changes reach the master in order."""
_client: _Client | None = None
_configured = False
_warned: set[str] = set()
_scopes: list[hang_detect] = []
_faulthandler_file: IO[str] | None = None
"""Kept open for the life of the process: faulthandler writes to its descriptor."""


def _obey(answer: bytes) -> None:
    """The master may answer with a command: so far only `exit`, from fault injection
    (`--inject exit:worker-1:3@step=50`), which ends this process with that status."""
    import json

    try:
        command = json.loads(answer).get("command") or {}
    except (ValueError, AttributeError):
        return
    code = command.get("exit") if isinstance(command, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def enabled() -> bool:
    """True when this process was started by trainguard and can reach its master's address."""
    with _lock:
        return _get_client() is not None


def heartbeat(step: int | None = None) -> None:
    """Tell the master this replica is alive (and, optionally, at which training step)."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"step: expected a non-negative int or None, got {step!r}")
    _post("/v1/heartbeat", {"step": step})


def set_retryable_errors(patterns: list[str]) -> None:
    """Failures whose log matches one of these regexes (or keywords) are retried."""
    if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"patterns: expected a list of strings, got {patterns!r}")
    _post("/v1/retryable_errors", {"patterns": list(patterns)})


ENV_CHECKPOINT_DIR = "TRAINGUARD_CHECKPOINT_DIR"
ENV_SNAPSHOT_DIR = "TRAINGUARD_SNAPSHOT_DIR"
ENV_ATTEMPT = "TRAINGUARD_ATTEMPT"
ENV_SNAPSHOT_PERSIST_EVERY = "TRAINGUARD_SNAPSHOT_PERSIST_EVERY"


def report(metrics: dict[str, object], checkpoint: str | None = None) -> None:
    """Report progress (`metrics`, with `step` if it has one) and, optionally, a checkpoint
    folder: it is committed into the job's storage atomically before the master is told,
    so `get_checkpoint()` after any crash returns the latest complete one."""
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics: expected a dict, got {metrics!r}")
    step = metrics.get("step")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else None
    name: str | None = None
    storage = os.environ.get(ENV_CHECKPOINT_DIR)
    if checkpoint is not None and storage:
        from trainguard.records import checkpoints

        name = checkpoints.commit(Path(checkpoint), storage, step=step, metrics=dict(metrics))
    _post("/v1/report", {"step": step, "metrics": dict(metrics), "checkpoint": name})


def get_checkpoint() -> str | None:
    """The folder of the newest complete checkpoint of this job, or None: the newest step
    that every rank holds in memory (`snapshot`), unless a durable checkpoint (a reported
    one, or a copy of snapshots) is of a later step."""
    storage = os.environ.get(ENV_CHECKPOINT_DIR)
    durable: Path | None = None
    if storage:
        from trainguard.records import checkpoints

        durable = checkpoints.latest(storage)
    memory = _memory_snapshot()
    if memory is not None and (durable is None or memory[0] >= _durable_step(durable)):
        return str(memory[1])
    return str(durable) if durable else None


def _durable_step(folder: Path) -> int:
    from trainguard.records import checkpoints

    step = (checkpoints.read_manifest(folder) or {}).get("step")
    return step if isinstance(step, int) else -1


def _memory_snapshot() -> tuple[int, Path] | None:
    root = os.environ.get(ENV_SNAPSHOT_DIR)
    if not root:
        return None
    from trainguard.records import snapshots

    step = snapshots.newest_complete(Path(root), _world())
    return None if step is None else (step, snapshots.step_dir(Path(root), step))


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else default


def _rank() -> int:
    return _int_env("RANK", 0)


def _world() -> int:
    return max(1, _int_env("WORLD_SIZE", 1))


def snapshot(state: object, step: int) -> None:
    """Keep `state` (anything pickle can write: model and optimizer state_dicts, the data
    loader's position, RNG states) for `step`, in the job's shared memory.

    Call it on every rank after each step: a copy into memory, no disk. After a restart,
    `load_snapshot()` gives back the newest step that every rank stored (a rank killed
    mid-step costs that step only). The master copies every N-th step to the checkpoint
    storage in the background (`checkpoint.snapshot_persist_every`), which is what is left
    if the master itself is killed. Outside trainguard it does nothing."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step: expected an integer >= 0, got {step!r}")
    root = os.environ.get(ENV_SNAPSHOT_DIR)
    if not root:
        _warn_outside()
        return
    from trainguard.records import snapshot_state, snapshots

    form, skeleton, parts = snapshot_state.parts(state)
    due = snapshots.due(step, _int_env(ENV_SNAPSHOT_PERSIST_EVERY, 0))
    writer = _snapshot_writer(Path(root))
    writer.write(_world(), _int_env(ENV_ATTEMPT, 0), step, parts, form, skeleton, not due)
    if due:
        # Only the steps the master copies: a message each step would cost a step's few %.
        writer.wait()  # the master reads the files it is told of
        _post("/v1/snapshot", {"step": step, "world": _world()})


_writer: Writer | None = None  # this process's, made at its first snapshot


def _snapshot_writer(root: Path) -> Writer:
    global _writer
    from trainguard.records import snapshots

    with _lock:
        if _writer is None or (_writer.root, _writer.rank) != (root, _rank()):
            if _writer is not None:
                _writer.close()
            _writer = snapshots.Writer(root, _rank())
        return _writer


def load_snapshot(folder: str | None = None) -> tuple[int, object] | None:
    """(step, state) of this rank from `folder` (default: `get_checkpoint()`), verified;
    None where there is none (a first run, or a checkpoint that holds no snapshots).

    The state is unpickled: load only what this job stored (as with `torch.load`)."""
    where = folder if folder is not None else get_checkpoint()
    if where is None:
        return None
    from trainguard.records import snapshot_state, snapshots

    found = snapshots.load(Path(where), _rank())
    if found is None:
        return None
    header, payload = found
    return header.step, snapshot_state.state_of(header.format, header.skeleton, payload)


def mark_checkpoint_bad(path: str) -> None:
    """This checkpoint could not be loaded: `get_checkpoint()` will offer the one before."""
    storage = os.environ.get(ENV_CHECKPOINT_DIR)
    if storage:
        from trainguard.records import checkpoints

        checkpoints.mark_bad(storage, Path(path).name)


def send_custom_message(text: str) -> None:
    """A line for the job's record and notifications (e.g. "eval loss 1.72")."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a string, got {text!r}")
    _post("/v1/message", {"text": text})


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
        with _lock:
            _scopes.append(self)
            _post_scope()

    def __exit__(self, *exc_info: object) -> None:
        with _lock:
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


def _post_scope() -> None:
    client = _get_client()
    if client is None:
        _warn_outside()
        return
    client.post("/v1/hang_detect", {"seconds": _scopes[-1].seconds if _scopes else None})


def _post(route: str, fields: dict[str, object]) -> None:
    with _lock:
        client = _get_client()
        if client is None:
            _warn_outside()
            return
        client.post(route, fields)


def _get_client() -> _Client | None:
    """Read the environment once; None outside trainguard."""
    global _client, _configured
    if not _configured:
        _configured = True
        url, token = os.environ.get(ENV_MASTER_URL), os.environ.get(ENV_TOKEN)
        replica = os.environ.get(ENV_REPLICA)
        if url and token and replica:
            _client = _parse(url, token, replica)
    return _client


def _parse(url: str, token: str, replica: str) -> _Client | None:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        scheme, host, port, prefix = parts.scheme, parts.hostname, parts.port, parts.path
    except ValueError:  # e.g. a port that is not a number
        scheme, host, port, prefix = "", None, None, ""
    if scheme != "http" or not host or not port:
        _warn_once("config", f"trainguard.sdk: {ENV_MASTER_URL}={url!r} is not http://host:port")
        return None
    return _Client(host, port, prefix.rstrip("/"), token, replica)


def _warn_outside() -> None:
    if "config" in _warned:
        return
    missing = [n for n in (ENV_MASTER_URL, ENV_TOKEN, ENV_REPLICA) if not os.environ.get(n)]
    _warn_once(
        "outside",
        f"trainguard.sdk: not started by trainguard ({', '.join(missing)} unset); "
        "SDK calls do nothing",
    )


def _warn_once(kind: str, message: str) -> None:
    """One warning of each kind per process, pointing at the training code's line."""
    if kind in _warned:
        return
    _warned.add(kind)
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, SdkWarning, stacklevel=level)


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
        _faulthandler_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- kept open
    except OSError as exc:
        _warn_once("faulthandler", f"trainguard.sdk: cannot open {path} for stack dumps: {exc}")
        return
    faulthandler.register(signal.SIGUSR2, file=_faulthandler_file, all_threads=True, chain=False)
    _post("/v1/faulthandler", {})


def _after_fork_in_child() -> None:
    """A forked child (e.g. a data loader worker) must not share the parent's socket or lock."""
    global _lock, _writer
    _lock = threading.Lock()
    _writer = None  # the parent's files: its to write
    if _client is not None:
        _client.close()


def _reset_for_tests() -> None:
    """Forget the connection, the environment read, the warnings given and the scopes."""
    global _client, _configured, _writer
    with _lock:
        if _client is not None:
            _client.close()
        if _writer is not None:
            _writer.close()
        _client, _configured, _writer = None, False, None
        _warned.clear()
        _scopes.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
_register_faulthandler()
