"""What training code tells the master through the SDK channel (the SdkHandler side)."""

from __future__ import annotations

import time
from collections.abc import Callable

from trainguard.hangs.watch import HangWatch
from trainguard.records.recorder import Recorder
from trainguard.records.schema import CUSTOM_MESSAGE_EVENT

LOGGED_CHARS = 200
"""How much of a custom message the master's log line shows."""


class Inbox:
    def __init__(
        self,
        hangs: HangWatch,
        rec: Recorder,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.hangs = hangs
        self.rec = rec
        self.say = say
        self.clock = clock
        self.retryable_errors: dict[str, list[str]] = {}  # replica -> its keywords
        self.faulthandler: set[str] = set()  # replicas that dump stacks on SIGUSR2
        self.pending_exit: dict[str, int] = {}  # injected: exit with this status
        self.preempt: str | None = None  # a preemption notice, told in every answer
        self.on_step: Callable[[str, int], None] = lambda _replica, _step: None
        self.on_progress: Callable[[str, int | None, dict[str, object], str | None], None] = (
            lambda *_: None
        )
        self.on_snapshot_stored: Callable[[str, int, int], None] = lambda *_: None

    def on_heartbeat(self, replica: str, step: int | None) -> None:
        self.hangs.beat(replica, step)
        if step is not None:
            self.on_step(replica, step)

    def on_hang_detect(self, replica: str, seconds: float | None) -> None:
        self.hangs.scope(replica, seconds)

    def on_retryable_errors(self, replica: str, patterns: list[str]) -> None:
        self.retryable_errors[replica] = list(patterns)

    def on_message(self, replica: str, text: str) -> None:
        self.rec.event(self.clock(), replica, CUSTOM_MESSAGE_EVENT, text)
        shown = text if len(text) <= LOGGED_CHARS else text[: LOGGED_CHARS - 3] + "..."
        self.say(f"message from {replica}: {shown}")  # the whole text is in the store

    def on_report(
        self, replica: str, step: int | None, metrics: dict[str, object], checkpoint: str | None
    ) -> None:
        self.on_heartbeat(replica, step)
        self.on_progress(replica, step, metrics, checkpoint)

    def on_faulthandler(self, replica: str) -> None:
        self.faulthandler.add(replica)

    def on_snapshot(self, replica: str, step: int, world: int) -> None:
        self.on_heartbeat(replica, step)
        self.on_snapshot_stored(replica, step, world)

    def command_for(self, replica: str) -> dict[str, object] | None:
        """A command for this replica, in the answer to its next SDK call: an injected
        exit (once), a preemption notice (in every answer from then on)."""
        command: dict[str, object] = {}
        code = self.pending_exit.pop(replica, None)
        if code is not None:
            command["exit"] = code
        if self.preempt is not None:
            command["preempt"] = self.preempt
        return command or None

    def keywords(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for ps in self.retryable_errors.values() for p in ps))
