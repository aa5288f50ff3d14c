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

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.notify.gate import Gate
from trainguard.notify.sinks import (
    AppriseSink,
    Item,
    Sink,
    Worker,
    post_webhook,
    run_command,
    where,
)
from trainguard.spec.notify_rules import EVENT_KINDS, NotifyRule

STAT_NAMES: tuple[str, ...] = ("delivered", "failed", "deduplicated", "rate_limited", "dropped")

QUEUE_SIZE = 1000  # per rule; when full the oldest event goes (a newer one says more)
# Keys the payload itself uses; a caller's field may not overwrite them.
_RESERVED = frozenset({"id", "event", "job_id", "job_name", "at_s", "text", "repeated"})

log = logging.getLogger("trainguard.notify")


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
        self._gates = [Gate(r.dedupe_window_s, r.rate_limit_per_min) for r in self._rules]
        self._workers = []
        for i, rule in enumerate(self._rules):
            label = f"rule {i} ({rule.sink} {where(rule)})"
            self._workers.append(
                Worker(label, rule, self._sink(rule, label), queue_size, self._count)
            )

    def _sink(self, rule: NotifyRule, label: str) -> Sink:
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
            return lambda item: post_webhook(url, secret, timeout_s, item)
        if rule.sink == "apprise":
            return AppriseSink(rule.url or "", timeout_s, self._job_name, label)
        command = list(rule.command or [])
        env = {"TRAINGUARD_JOB_ID": self._job_id, "TRAINGUARD_JOB_NAME": self._job_name}
        return lambda item: run_command(command, env, timeout_s, item)

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
            worker.put(Item(kind, text, state, payload["id"], body))

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
