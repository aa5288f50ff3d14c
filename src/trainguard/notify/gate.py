"""One rule's dedupe and rate limit: which events go out, which are held or dropped."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

RATE_WINDOW_S = 60.0

Key = tuple[str, str, str | None]  # (kind, text, state)
Verdict = Literal["send", "deduplicated", "rate_limited"]


@dataclass
class Gate:
    """One rule's memory for dedupe and rate limiting; `now` comes from the Notifier's clock.

    The dedupe window starts at the last event of a key that was let through, so a steady
    stream of repeats still sends one event (with its `repeated` count) per window.
    """

    window_s: float
    per_min: int
    seen: dict[Key, tuple[float, int]] = field(default_factory=dict)  # -> (sent at, held since)
    sent: deque[float] = field(default_factory=deque)

    def admit(self, key: Key, now: float) -> tuple[Verdict, int]:
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
