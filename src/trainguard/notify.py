"""Notifications (R-REC-2): rules pick events, sinks deliver them; the master never waits.

(Work in progress: the Notifier is being written; NotifyRule is the config shape.)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EventKind = Literal["state_change", "restart", "hang", "isolation", "custom_message"]
EVENT_KINDS: tuple[str, ...] = ("state_change", "restart", "hang", "isolation", "custom_message")


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
    dedupe_window_s: float = Field(default=60.0, ge=0)
    rate_limit_per_min: int = Field(default=30, ge=1)
