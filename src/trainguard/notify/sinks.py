"""Sinks (webhook, apprise, command) and the worker thread that feeds each rule's sink
from a bounded queue, retrying with exponential backoff. Failures are counted and logged
once; they never raise into the master."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.client import HTTPException, HTTPMessage
from typing import IO, Any
from urllib.parse import urlsplit

from trainguard.notify.signing import EVENT_HEADER, SIGNATURE_HEADER, sign
from trainguard.spec.notify_rules import NotifyRule

BACKOFF_CAP_S = 30.0

log = logging.getLogger("trainguard.notify")


@dataclass(frozen=True)
class Item:
    kind: str
    text: str
    state: str | None  # the new state of a state_change, upper case
    event_id: str
    body: bytes  # the exact JSON bytes that are sent (and signed)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    retry: bool = False
    detail: str = ""
    wait_s: float | None = None  # the server's Retry-After, when it gave one
    quiet: bool = False  # the sink already said why (once), so no line per event


Sink = Callable[[Item], Outcome]


class NoRedirect(urllib.request.HTTPRedirectHandler):
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


def retry_after(value: str | None) -> float | None:
    return float(value) if value and value.strip().isdigit() else None


def post_webhook(url: str, secret: str | None, timeout_s: float, item: Item) -> Outcome:
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
        with urllib.request.build_opener(NoRedirect).open(request, timeout=timeout_s) as resp:
            resp.read(65536)
        return Outcome(ok=True)
    except urllib.error.HTTPError as exc:
        exc.close()
        retry = exc.code == 429 or exc.code >= 500
        return Outcome(
            False, retry, f"HTTP {exc.code}", retry_after(exc.headers.get("Retry-After"))
        )
    except urllib.error.URLError as exc:  # refused, unreachable, DNS, connect timeout
        return Outcome(False, True, f"{type(exc.reason).__name__}: {exc.reason}")
    except (OSError, HTTPException) as exc:  # read timeout, reset, malformed response
        return Outcome(False, True, f"{type(exc).__name__}: {exc}")


def run_command(command: list[str], env: dict[str, str], timeout_s: float, item: Item) -> Outcome:
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
        return Outcome(False, True, f"{command[0]} ran past {timeout_s:g}s and was killed")
    except OSError as exc:  # a missing program will not appear by retrying
        return Outcome(False, False, f"cannot run {command[0]}: {exc}")
    if done.returncode == 0:
        return Outcome(ok=True)
    tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
    return Outcome(False, True, f"exit code {done.returncode}" + (f": {tail[0]}" if tail else ""))


class AppriseSink:
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

    def __call__(self, item: Item) -> Outcome:
        if self._app is None and self._broken is None:
            self._load()
        if self._broken is not None:
            return Outcome(False, False, self._broken, quiet=True)
        state = item.state or ""
        if item.kind in ("hang", "isolation", "node_probation") or state in (
            "FAILED",
            "EXPIRED",
            "INTERRUPTED",
        ):
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
        return Outcome(True) if ok else Outcome(False, True, "apprise reported a failure")


def where(rule: NotifyRule) -> str:
    """Where a rule sends, for log lines: without credentials, paths or tokens."""
    if rule.sink == "command":
        return os.path.basename((rule.command or ["?"])[0])
    parts = urlsplit(rule.url or "")
    if rule.sink == "apprise":
        return f"{parts.scheme}://…"
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "") + "/…"


class Worker:
    """One rule's queue and daemon thread: delivers events in order, retrying with backoff."""

    def __init__(
        self,
        label: str,
        rule: NotifyRule,
        send: Sink,
        queue_size: int,
        count: Callable[[str, int], None],
    ) -> None:
        self.label = label
        self._rule, self._send, self._size, self._count = rule, send, queue_size, count
        self._items: deque[Item] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._stop = threading.Event()  # the close deadline passed: give up now
        self._said_full = False
        self._thread = threading.Thread(target=self._run, name=f"trainguard-notify {label}")
        self._thread.daemon = True
        self._thread.start()

    def put(self, item: Item) -> None:
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

    def _deliver(self, item: Item) -> None:
        attempts = 0
        while True:
            attempts += 1
            try:
                out = self._send(item)
            except Exception as exc:  # a sink's bug must not end the thread
                out = Outcome(False, False, f"{type(exc).__name__}: {exc}")
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
        if not out.quiet:
            log.warning(
                "notify: %s: %s event %s not delivered after %d attempt(s): %s",
                self.label,
                item.kind,
                item.event_id,
                attempts,
                out.detail,
            )
        self._count("failed", 1)  # after the log line: a reader of the stats sees both
