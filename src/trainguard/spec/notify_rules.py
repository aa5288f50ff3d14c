"""Notification rules as configuration: which events go to which sink (webhook, apprise,
command). Sending is `trainguard.notify`; the spec and the server's config hold the rules."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from trainguard.spec.base import SpecModel
from trainguard.spec.text import shown
from trainguard.states import JobState

EventKind = Literal[
    "state_change", "restart", "hang", "isolation", "custom_message", "node_probation"
]
EVENT_KINDS: tuple[str, ...] = (
    "state_change",
    "restart",
    "hang",
    "isolation",
    "custom_message",
    "node_probation",  # a node went on probation: every job avoids it (R-EVID-4)
)
_JOB_STATES = tuple(s.value for s in JobState)


class NotifyRule(SpecModel):
    """Which events go to which sink, e.g. every FAILED state change to a webhook."""

    # The event kinds this rule sends (default: all of them); `states` narrows `state_change`.
    events: list[EventKind] = Field(default_factory=lambda: list(EVENT_KINDS))  # type: ignore[arg-type]
    # For state_change events: only these target states (default: every state).
    states: list[str] | None = None
    # Where they go: webhook (a JSON POST to url), apprise (its url), or command (run with
    # the JSON event on its stdin).
    sink: Literal["webhook", "apprise", "command"]
    url: str | None = None  # webhook URL, or an apprise URL
    secret: str | None = None  # HMAC-SHA256 key for the webhook signature header
    secret_env: str | None = None  # or the name of an environment variable that holds it
    command: list[str] | None = None  # the command sink's program and arguments
    # How long one delivery may take (the HTTP request; a command is killed past it) before
    # it counts as failed.
    timeout_s: float = Field(default=5.0, gt=0, le=120)
    # Tries after the first for a delivery that failed in a way worth retrying (HTTP 429 or
    # 5xx, the network, a timeout, a command's nonzero exit).
    retries: int = Field(default=3, ge=0, le=20)
    # The first retry waits this long, each next one twice as long (at most BACKOFF_CAP_S).
    backoff_s: float = Field(default=0.5, gt=0, le=60)
    # The same event (kind, text, state) again within this long of the last one sent is held
    # back; the next one sent counts it in `repeated` (0: no dedupe).
    dedupe_window_s: float = Field(default=60.0, ge=0)
    # At most this many events of the rule go out in any 60 s; the rest are dropped (and
    # counted as `rate_limited`).
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
                    f"states: {shown(name)} is not a job state (one of {', '.join(_JOB_STATES)})"
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
                f"url: a webhook url must start with http:// or https://, got {shown(self.url)}"
            )
        if self.sink == "command" and (not self.command or not self.command[0]):
            raise ValueError(
                "command: a command rule needs a program and its arguments, "
                f"got {shown(self.command)}"
            )
        if self.secret and self.secret_env:
            raise ValueError(
                f"secret_env: set secret or secret_env, not both (got {shown(self.secret_env)})"
            )
        return self
