"""Notifications (R-REC-2): rules pick events, sinks deliver them; the master never waits.

`Notifier.emit()` only filters, deduplicates, rate-limits and queues. Each rule has its own
daemon thread and bounded queue, so a dead or slow sink delays neither the master's event
loop nor another rule. Sinks:

- webhook: a JSON POST (standard library only) with `X-Trainguard-Event: <kind>` and, when
  a secret is set, `X-Trainguard-Signature: sha256=<hex HMAC-SHA256 of the body>` (see
  `sign` / `verify`). Connection errors, timeouts, 5xx and 429 are retried with exponential
  backoff; other 4xx and 3xx are not (a retry would get the same answer).
- apprise: any URL the apprise library understands (the `notify` extra), imported lazily.
- command: a local program (no shell) with the event JSON on stdin and TRAINGUARD_* variables.

Sink failures never raise: each is counted in `Notifier.stats` and logged once on the
"trainguard.notify" logger.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import logging
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from http.client import HTTPException, HTTPMessage
from typing import IO, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainguard.states import JobState

EventKind = Literal["state_change", "restart", "hang", "isolation", "custom_message"]
EVENT_KINDS: tuple[str, ...] = ("state_change", "restart", "hang", "isolation", "custom_message")
STAT_NAMES: tuple[str, ...] = ("delivered", "failed", "deduplicated", "rate_limited", "dropped")

EVENT_HEADER = "X-Trainguard-Event"
SIGNATURE_HEADER = "X-Trainguard-Signature"
QUEUE_SIZE = 1000  # per rule; when full the oldest event goes (a newer one says more)
BACKOFF_CAP_S = 30.0
RATE_WINDOW_S = 60.0
# Keys the payload itself uses; a caller's field may not overwrite them.
_RESERVED = frozenset({"id", "event", "job_id", "job_name", "at_s", "text", "repeated"})
_JOB_STATES = tuple(s.value for s in JobState)

log = logging.getLogger("trainguard.notify")


class NotifyRule(BaseModel):
    """Which events go to which sink, e.g. every FAILED state change to a webhook."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    events: list[EventKind] = Field(default_factory=lambda: list(EVENT_KINDS))  # type: ignore[arg-type]
    # For state_change events: only these target states (default: every state).
    states: list[str] | None = None
    sink: Literal["webhook", "apprise", "command"]
    url: str | None = None  # webhook URL, or an apprise URL
    secret: str | None = None  # HMAC-SHA256 key for the webhook signature header
    secret_env: str | None = None  # or the name of an environment variable that holds it
    command: list[str] | None = None  # the command sink's program and arguments
    timeout_s: float = Field(default=5.0, gt=0, le=120)
    retries: int = Field(default=3, ge=0, le=20)
    # The first retry waits this long, each next one twice as long (at most BACKOFF_CAP_S).
    backoff_s: float = Field(default=0.5, gt=0, le=60)
    dedupe_window_s: float = Field(default=60.0, ge=0)
    rate_limit_per_min: int = Field(default=30, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _known_states(cls, data: Any) -> Any:
        """Job states, in any case ("failed" means FAILED); a typo would silently match nothing."""
        states = data.get("states") if isinstance(data, dict) else None
        if not isinstance(states, list):
            return data
        for name in states:
            if not isinstance(name, str) or name.strip().upper() not in _JOB_STATES:
                raise ValueError(
                    f"states: {name!r} is not a job state (one of {', '.join(_JOB_STATES)})"
                )
        return {**data, "states": [name.strip().upper() for name in states]}

    @model_validator(mode="after")
    def _sink_has_what_it_needs(self) -> NotifyRule:
        if not self.events:
            raise ValueError("events: a rule needs at least one event kind, got []")
        if self.sink in ("webhook", "apprise") and not self.url:
            article = "an" if self.sink == "apprise" else "a"
            raise ValueError(f"url: {article} {self.sink} rule needs a url")
        if self.sink == "webhook" and urlsplit(self.url or "").scheme not in ("http", "https"):
            raise ValueError(
                f"url: a webhook url must start with http:// or https://, got {self.url!r}"
            )
        if self.sink == "command" and (not self.command or not self.command[0]):
            raise ValueError(
                f"command: a command rule needs a program and its arguments, got {self.command!r}"
            )
        if self.secret and self.secret_env:
            raise ValueError(
                f"secret_env: set secret or secret_env, not both (got {self.secret_env!r})"
            )
        return self


# ---------------------------------------------------------------- signatures


def sign(secret: str, body: bytes) -> str:
    """The signature header value for `body`: "sha256=" + hex HMAC-SHA256 keyed by `secret`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True if `header` signs exactly `body` with `secret` (constant-time, for receivers)."""
    if not header:
        return False
    return hmac.compare_digest(
        sign(secret, body).encode(), header.strip().encode("utf-8", "replace")
    )


# ---------------------------------------------------------------- dedupe and rate limit

_Key = tuple[str, str, str | None]  # (kind, text, state)
_Verdict = Literal["send", "deduplicated", "rate_limited"]


@dataclass
class _Gate:
    """One rule's memory for dedupe and rate limiting; `now` comes from the Notifier's clock.

    The dedupe window starts at the last event of a key that was let through, so a steady
    stream of repeats still sends one event (with its `repeated` count) per window.
    """

    window_s: float
    per_min: int
    seen: dict[_Key, tuple[float, int]] = field(default_factory=dict)  # -> (sent at, held since)
    sent: deque[float] = field(default_factory=deque)

    def admit(self, key: _Key, now: float) -> tuple[_Verdict, int]:
        """Whether to send an event of `key` now, and how many repeats were held back before it."""
        last = self.seen.get(key)
        # A clock that went backwards (NTP) ends a window rather than stretching it.
        if last is not None and 0 <= now - last[0] < self.window_s:
            self.seen[key] = (last[0], last[1] + 1)
            return "deduplicated", 0
        while self.sent and not 0 <= now - self.sent[0] < RATE_WINDOW_S:
            self.sent.popleft()
        if len(self.sent) >= self.per_min:
            return "rate_limited", 0
        self.sent.append(now)
        if self.window_s > 0:
            self.seen[key] = (now, 0)
            if len(self.seen) > 4 * self.per_min + 64:  # forget keys whose window is over
                self.seen = {k: v for k, v in self.seen.items() if 0 <= now - v[0] < self.window_s}
        return "send", last[1] if last else 0


# ---------------------------------------------------------------- sinks


@dataclass(frozen=True)
class _Item:
    kind: str
    text: str
    state: str | None  # the new state of a state_change, upper case
    event_id: str
    body: bytes  # the exact JSON bytes that are sent (and signed)


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    retry: bool = False
    detail: str = ""
    wait_s: float | None = None  # the server's Retry-After, when it gave one
    quiet: bool = False  # the sink already said why (once), so no line per event


_Sink = Callable[[_Item], _Outcome]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib would turn a redirected POST into a GET without the body; report the 3xx instead."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def _retry_after(value: str | None) -> float | None:
    return float(value) if value and value.strip().isdigit() else None


def _post(url: str, secret: str | None, timeout_s: float, item: _Item) -> _Outcome:
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "trainguard-notify",
        EVENT_HEADER: item.kind,
    }
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, item.body)
    request = urllib.request.Request(url, data=item.body, headers=headers, method="POST")
    try:
        # Built per call so proxy variables are read when sending, as urlopen would.
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout_s) as resp:
            resp.read(65536)
        return _Outcome(ok=True)
    except urllib.error.HTTPError as exc:
        exc.close()
        retry = exc.code == 429 or exc.code >= 500
        return _Outcome(
            False, retry, f"HTTP {exc.code}", _retry_after(exc.headers.get("Retry-After"))
        )
    except urllib.error.URLError as exc:  # refused, unreachable, DNS, connect timeout
        return _Outcome(False, True, f"{type(exc.reason).__name__}: {exc.reason}")
    except (OSError, HTTPException) as exc:  # read timeout, reset, malformed response
        return _Outcome(False, True, f"{type(exc).__name__}: {exc}")


def _run_command(
    command: list[str], env: dict[str, str], timeout_s: float, item: _Item
) -> _Outcome:
    env = {
        **os.environ,
        **env,
        "TRAINGUARD_EVENT": item.kind,
        "TRAINGUARD_EVENT_TEXT": item.text.replace("\0", ""),
    }
    try:
        done = subprocess.run(
            command,
            input=item.body,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return _Outcome(False, True, f"{command[0]} ran past {timeout_s:g}s and was killed")
    except OSError as exc:  # a missing program will not appear by retrying
        return _Outcome(False, False, f"cannot run {command[0]}: {exc}")
    if done.returncode == 0:
        return _Outcome(ok=True)
    tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
    return _Outcome(False, True, f"exit code {done.returncode}" + (f": {tail[0]}" if tail else ""))


class _Apprise:
    """An apprise sink; the library is imported on first use, on the rule's own thread."""

    def __init__(self, url: str, timeout_s: float, job_name: str, label: str) -> None:
        self._url, self._timeout_s, self._job_name, self._label = url, timeout_s, job_name, label
        self._app: Any = None
        self._types: Any = None
        self._broken: str | None = None

    def _load(self) -> None:
        try:
            lib = importlib.import_module("apprise")
        except ImportError:
            self._broken = "apprise is not installed"
            log.warning(
                "notify: %s: apprise is not installed (pip install 'trainguard[notify]'); "
                "this rule's events are dropped",
                self._label,
            )
            return
        plugin = lib.Apprise.instantiate(self._url)
        if plugin is None:
            self._broken = "apprise does not understand the url"
            log.warning(
                "notify: %s: apprise does not understand the url; events dropped", self._label
            )
            return
        plugin.socket_connect_timeout = plugin.socket_read_timeout = self._timeout_s
        self._app = lib.Apprise()
        self._app.add(plugin)
        self._types = lib.NotifyType

    def __call__(self, item: _Item) -> _Outcome:
        if self._app is None and self._broken is None:
            self._load()
        if self._broken is not None:
            return _Outcome(False, False, self._broken, quiet=True)
        state = item.state or ""
        if item.kind in ("hang", "isolation") or state in ("FAILED", "EXPIRED", "INTERRUPTED"):
            kind = "FAILURE"
        elif item.kind == "restart":
            kind = "WARNING"
        else:
            kind = "SUCCESS" if state == "SUCCEEDED" else "INFO"
        ok = self._app.notify(
            body=item.text,
            title=f"trainguard: {self._job_name} {item.kind}",
            notify_type=getattr(self._types, kind),
        )
        # apprise 1.x answers a bool, 2.x a result object that is truthy on success.
        return _Outcome(True) if ok else _Outcome(False, True, "apprise reported a failure")


def _where(rule: NotifyRule) -> str:
    """Where a rule sends, for log lines: without credentials, paths or tokens."""
    if rule.sink == "command":
        return os.path.basename((rule.command or ["?"])[0])
    parts = urlsplit(rule.url or "")
    if rule.sink == "apprise":
        return f"{parts.scheme}://…"
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "") + "/…"


# ---------------------------------------------------------------- workers


class _Worker:
    """One rule's queue and daemon thread: delivers events in order, retrying with backoff."""

    def __init__(
        self,
        label: str,
        rule: NotifyRule,
        send: _Sink,
        queue_size: int,
        count: Callable[[str, int], None],
    ) -> None:
        self.label = label
        self._rule, self._send, self._size, self._count = rule, send, queue_size, count
        self._items: deque[_Item] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._stop = threading.Event()  # the close deadline passed: give up now
        self._said_full = False
        self._thread = threading.Thread(target=self._run, name=f"trainguard-notify {label}")
        self._thread.daemon = True
        self._thread.start()

    def put(self, item: _Item) -> None:
        with self._cv:
            if len(self._items) >= self._size:
                self._items.popleft()
                self._count("dropped", 1)
                if not self._said_full:
                    self._said_full = True
                    log.warning(
                        "notify: %s: %d events queued; dropping the oldest", self.label, self._size
                    )
            self._items.append(item)
            self._cv.notify()

    def finish(self) -> None:
        """Deliver what is queued, then end."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def abandon(self) -> None:
        """The deadline passed: drop what is still queued and stop retrying."""
        self._stop.set()
        with self._cv:
            left = len(self._items)
            self._items.clear()
            self._closing = True
            self._cv.notify_all()
        if left:
            self._count("dropped", left)
            log.warning("notify: %s: close deadline passed; %d event(s) dropped", self.label, left)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._closing:
                    self._cv.wait()
                if not self._items or self._stop.is_set():
                    return
                item = self._items.popleft()
            self._deliver(item)

    def _deliver(self, item: _Item) -> None:
        attempts = 0
        while True:
            attempts += 1
            try:
                out = self._send(item)
            except Exception as exc:  # a sink's bug must not end the thread
                out = _Outcome(False, False, f"{type(exc).__name__}: {exc}")
            if out.ok:
                self._count("delivered", 1)
                return
            if not out.retry or attempts > self._rule.retries:
                break
            backoff = self._rule.backoff_s * 2 ** (attempts - 1)
            if self._stop.wait(
                min(out.wait_s if out.wait_s is not None else backoff, BACKOFF_CAP_S)
            ):
                out = replace(out, detail=f"{out.detail} (stopped retrying at close)")
                break
        self._count("failed", 1)
        if not out.quiet:
            log.warning(
                "notify: %s: %s event %s not delivered after %d attempt(s): %s",
                self.label,
                item.kind,
                item.event_id,
                attempts,
                out.detail,
            )


# ---------------------------------------------------------------- the notifier


class Notifier:
    """Sends one job's events to the sinks its rules name, never on the caller's thread."""

    def __init__(
        self,
        rules: Sequence[NotifyRule],
        *,
        job_id: str,
        job_name: str,
        clock: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self._rules = tuple(rules)
        self._job_id, self._job_name, self._clock = job_id, job_name, clock
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(STAT_NAMES, 0)
        self._closed = False
        self._gates = [_Gate(r.dedupe_window_s, r.rate_limit_per_min) for r in self._rules]
        self._workers = []
        for i, rule in enumerate(self._rules):
            label = f"rule {i} ({rule.sink} {_where(rule)})"
            self._workers.append(
                _Worker(label, rule, self._sink(rule, label), queue_size, self._count)
            )

    def _sink(self, rule: NotifyRule, label: str) -> _Sink:
        timeout_s = rule.timeout_s
        if rule.sink == "webhook":
            url, secret = rule.url or "", rule.secret
            if rule.secret_env:
                secret = os.environ.get(rule.secret_env)
                if not secret:
                    log.warning(
                        "notify: %s: secret_env %s is not set; webhooks go unsigned",
                        label,
                        rule.secret_env,
                    )
            return lambda item: _post(url, secret, timeout_s, item)
        if rule.sink == "apprise":
            return _Apprise(rule.url or "", timeout_s, self._job_name, label)
        command = list(rule.command or [])
        env = {"TRAINGUARD_JOB_ID": self._job_id, "TRAINGUARD_JOB_NAME": self._job_name}
        return lambda item: _run_command(command, env, timeout_s, item)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self._stats[name] += n

    @property
    def stats(self) -> dict[str, int]:
        """Counts of events: delivered, failed, deduplicated, rate_limited, dropped."""
        with self._lock:
            return dict(self._stats)

    def emit(self, kind: str, text: str, **fields: Any) -> None:
        """Queue an event for every rule that wants it; returns at once.

        For state_change, pass state=<new state> and previous=<old state>. Other fields go
        into the JSON payload as they are (values JSON cannot hold become strings).
        """
        if kind not in EVENT_KINDS:
            raise ValueError(f"kind: must be one of {', '.join(EVENT_KINDS)}, got {kind!r}")
        clash = sorted(_RESERVED.intersection(fields))
        if clash:
            raise ValueError(f"fields: {clash[0]!r} is part of every payload and cannot be set")
        if self._closed:
            log.warning("notify: %s event after close() dropped: %s", kind, text)
            self._count("dropped", 1)
            return
        now = self._clock()
        state = None if fields.get("state") is None else str(fields["state"]).upper()
        payload: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "event": kind,
            "job_id": self._job_id,
            "job_name": self._job_name,
            "at_s": now,
            "text": text,
            **fields,
        }
        plain: bytes | None = None
        for rule, gate, worker in zip(self._rules, self._gates, self._workers, strict=True):
            if kind not in rule.events:
                continue
            if kind == "state_change" and rule.states is not None and state not in rule.states:
                continue
            with self._lock:
                verdict, repeated = gate.admit((kind, text, state), now)
                if verdict != "send":
                    self._stats[verdict] += 1
                    continue
            if repeated:
                body = _dumps({**payload, "repeated": repeated})
            else:
                body = plain = plain or _dumps(payload)
            worker.put(_Item(kind, text, state, payload["id"], body))

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued, within the deadline; then stop the workers.

        A sink still stuck past the deadline is left to its daemon thread, which ends when
        that attempt times out; what was still queued counts as dropped.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        self._closed = True
        for worker in self._workers:
            worker.finish()
        for worker in self._workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        for worker in self._workers:
            worker.abandon()

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dumps(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, default=str, separators=(",", ":")).encode()
