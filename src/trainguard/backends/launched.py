"""The current attempt's launches, by replica: what a start (every replica, or one
restarted alone) is laid out within, so a replica restarted alone gets the node variables
of the whole attempt's placement. One table for every backend that lays ranks out."""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.backends.interface import Launch


class Launched:
    def __init__(self) -> None:
        self.by_replica: dict[str, Launch] = {}

    def add(self, launches: Sequence[Launch]) -> dict[str, Launch]:
        """The attempt's launches once `launches` are added (a new attempt forgets the
        last one's)."""
        attempt = max((la.attempt for la in launches), default=-1)
        kept = {r: la for r, la in self.by_replica.items() if la.attempt == attempt}
        kept.update({la.replica: la for la in launches if la.attempt == attempt})
        self.by_replica = kept
        return kept
