"""The SDK's connection to the master: one HTTP connection per process, the warnings it
gives when it cannot deliver, and the commands the master answers with. Standard library
only; http.client and json load on the first message sent."""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings

from trainguard.storage.env import ENV_MASTER_URL, ENV_REPLICA, ENV_TOKEN

TYPE_CHECKING = False
if TYPE_CHECKING:
    import http.client


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

    def post(self, route: str, fields: dict[str, object]) -> bool:
        """Deliver undelivered state first, then this message; drop it if the master is gone.
        True when it reached the master (state not yet delivered is kept, and sent later)."""
        if route in _STATE_ROUTES:
            self._stale[route] = fields
        if time.monotonic() < self._quiet_until_s:
            return False
        for state_route in list(self._stale):
            if not self._send(state_route, self._stale[state_route]):
                return False
            del self._stale[state_route]
        return route in _STATE_ROUTES or self._send(route, fields)

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
                warn_once(
                    "refused",
                    f"trainguard.sdk: the master refused {route} with {response.status} "
                    f"{answer.decode(errors='replace').strip()}; such messages are dropped",
                )
            return True
        self._quiet_until_s = time.monotonic() + _RETRY_AFTER_S
        warn_once(
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
"""Guards the state below and the connection: messages reach the master in order."""
_client: _Client | None = None
_configured = False
_warned: set[str] = set()
_HERE = os.path.dirname(os.path.abspath(__file__))


def lock() -> threading.Lock:
    """The lock of this process's connection (a new one in a forked child)."""
    return _lock


PREEMPTED: list[str] = []
"""The master's preemption notice, once it gave one (`sdk.preempted()` reads it)."""


def _obey(answer: bytes) -> None:
    """The master may answer with a command: `exit`, from fault injection
    (`--inject exit:worker-1:3@step=50`), which ends this process with that status, and
    `preempt`, the notice that the job is about to be stopped (checkpoint now)."""
    import json

    try:
        command = json.loads(answer).get("command") or {}
    except (ValueError, AttributeError):
        return
    notice = command.get("preempt") if isinstance(command, dict) else None
    if isinstance(notice, str) and not PREEMPTED:
        PREEMPTED.append(notice)
    code = command.get("exit") if isinstance(command, dict) else None
    if isinstance(code, int) and not isinstance(code, bool):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def enabled() -> bool:
    """True when this process was started by trainguard and can reach its master's address."""
    with _lock:
        return get_client() is not None


def post(route: str, fields: dict[str, object]) -> bool:
    """Send a message to the master, in order with every other; nothing outside trainguard.
    True when it reached the master."""
    with _lock:
        client = get_client()
        if client is None:
            warn_outside()
            return False
        return client.post(route, fields)


def get_client() -> _Client | None:
    """Read the environment once; None outside trainguard. The caller holds `lock()`."""
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
        warn_once("config", f"trainguard.sdk: {ENV_MASTER_URL}={url!r} is not http://host:port")
        return None
    return _Client(host, port, prefix.rstrip("/"), token, replica)


def warn_outside() -> None:
    if "config" in _warned:
        return
    missing = [n for n in (ENV_MASTER_URL, ENV_TOKEN, ENV_REPLICA) if not os.environ.get(n)]
    warn_once(
        "outside",
        f"trainguard.sdk: not started by trainguard ({', '.join(missing)} unset); "
        "SDK calls do nothing",
    )


def warn_once(kind: str, message: str) -> None:
    """One warning of each kind per process, pointing at the training code's line."""
    if kind in _warned:
        return
    _warned.add(kind)
    frame, level = sys._getframe(0), 1
    while frame.f_back is not None and os.path.dirname(frame.f_code.co_filename) == _HERE:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, SdkWarning, stacklevel=level)


def after_fork_in_child() -> None:
    """A forked child (e.g. a data loader worker) must not share the parent's socket or lock."""
    global _lock
    _lock = threading.Lock()
    if _client is not None:
        _client.close()


def reset_for_tests() -> None:
    """Forget the connection, the environment read and the warnings given."""
    global _client, _configured
    if _client is not None:
        _client.close()
    _client, _configured = None, False
    _warned.clear()
    PREEMPTED.clear()
