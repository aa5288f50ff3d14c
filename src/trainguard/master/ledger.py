"""The job's accounts (R-POL-3, R-REC-1): budgets charged, failures and restarts written.

The master decides and acts; the ledger remembers what each failure cost, who failed
with it (its cascade), what it isolated, and writes the records `explain` and
`records` read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainguard.classify.classes import Classification, FailureClass
from trainguard.policy.actions import Decision, describe
from trainguard.policy.budgets import Budgets, Failure
from trainguard.policy.decisions import error_code
from trainguard.policy.gpus import GpuPool
from trainguard.records.recorder import Recorder


def error_source(c: Classification) -> str:
    if c.failure_class is FailureClass.HANG:
        return "hang_detector"
    if c.failure_class is FailureClass.EXIT_HANG:
        return "exit_hang_detector"
    if c.failure_class is FailureClass.INTERNAL:
        return "internal"
    if c.failure_class is FailureClass.NODE_LOST:
        return "backend"
    if c.matched_line is not None:
        return "log"
    return "exit_code"


class Ledger:
    def __init__(self, rec: Recorder, gpus: GpuPool, say: Callable[[str], None]) -> None:
        self.rec = rec
        self.gpus = gpus
        self.say = say
        self.budgets = Budgets()
        self.restarts = 0
        self.decided_s = 0.0  # when the decision on the current failure was taken
        self.snapshot_id: int | None = None  # stacks taken for the current failure
        self._cascade: list[str] = []
        self._isolation: str | None = None
        self.injected: dict[str, str] = {}  # replica -> the injection it got this attempt
        # The backend's say on what a failure takes out of the next attempt (a lost node).
        self.isolate_node: Callable[[str, Classification], str | None] = lambda _r, _c: None

    def failure(self, root: Failure, others: Sequence[Failure], decision: Decision) -> None:
        """Charge the budgets; write the root cause and each failure of its cascade."""
        self.budgets = self.budgets.after(root, decision)
        c = root.classification
        hang = c.failure_class is FailureClass.HANG
        self._isolation = self.gpus.isolate_after(
            root.replica, c.hardware, c.rule, hang
        ) or self.isolate_node(root.replica, c)
        if self._isolation:
            self.say(self._isolation)
        self.rec.failure(root, root_cause=True, decision=describe(decision))
        cascade = [f for f in others if f is not root and f.attempt == root.attempt]
        for f in cascade:
            self.rec.failure(
                f, root_cause=False, decision=f"cascade of {root.replica}", cascade_of=root.replica
            )
        self._cascade = [f.replica for f in cascade]

    def restart(self, decision: Decision, failure: Failure, seen_s: float) -> int:
        """Write the restart record of the failure just recorded; returns its id."""
        c = failure.classification
        self.restarts += 1
        return self.rec.restart(
            round=self.restarts,
            at_s=self.decided_s,
            replica=failure.replica,
            node=failure.node,
            error_code=error_code(c),
            error_message=c.message,
            error_source=(
                "injection"
                if failure.replica in self.injected and c.kind != "hang"
                else error_source(c)
            ),
            failure_class=c.failure_class.value if c.failure_class else None,
            rule=c.rule,
            decision=describe(decision),
            detect_ms=max(0.0, self.decided_s - seen_s) * 1000,
            fingerprint=c.fingerprint,
            matched_line=c.matched_line,
            cascade=", ".join(self._cascade) or None,
            snapshot_id=self.snapshot_id,
            isolated=self._isolation,
        )
