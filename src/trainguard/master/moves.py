"""The master's state moves, checked against the transitions table (`states.check_move`).

An illegal move raises under strict transitions (the tests set STRICT_TRANSITIONS_ENV);
in production it is recorded as an internal error and made anyway, so that a bug of
bookkeeping does not lose a job that is training.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from trainguard.states import IllegalTransition, JobState, ReplicaState, check_move

STRICT_TRANSITIONS_ENV = "TRAINGUARD_STRICT_TRANSITIONS"
"""Set to 1, an illegal state move raises instead of being recorded."""

INTERNAL_EVENT = "internal_error"
"""The event kind an illegal move is recorded under."""


def strict_transitions(strict: bool | None) -> bool:
    """`strict` as given, or (None) whether STRICT_TRANSITIONS_ENV is 1."""
    return os.environ.get(STRICT_TRANSITIONS_ENV) == "1" if strict is None else strict


def checked(
    old: JobState | ReplicaState,
    new: JobState | ReplicaState,
    strict: bool,
    note: Callable[[str], None],
) -> None:
    """Raise `IllegalTransition` for an illegal move when `strict`; `note` it otherwise."""
    try:
        check_move(old, new)
    except IllegalTransition as exc:
        if strict:
            raise
        note(str(exc))
