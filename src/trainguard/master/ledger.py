"""The job's accounts (R-POL-3, R-REC-1): budgets charged, failures and restarts written.

The master decides and acts; the ledger remembers what each failure cost, who failed
with it (its cascade), what it isolated, and writes the records `explain` and
`records` read. What only the master knows of a restart (when it was decided, the stacks
taken for it, whether its failure was injected) it passes as arguments.
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
    def __init__(
        self,
        rec: Recorder,
        gpus: GpuPool,
        say: Callable[[str], None],
        isolate_node: Callable[[str, Classification], str | None] = lambda _r, _c: None,
    ) -> None:
        """`isolate_node`: the backend's say on what a failure takes out of the next
        attempt (a lost node)."""
        self.rec = rec
        self.gpus = gpus
        self.say = say
        self.budgets = Budgets()
        self.restarts = 0
        self._cascade: list[str] = []
        self._isolation: str | None = None
        self.isolate_node = isolate_node

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

    def restart(
        self,
        decision: Decision,
        failure: Failure,
        seen_s: float,
        decided_s: float,
        *,
        injected: bool = False,
        snapshot_id: int | None = None,
    ) -> int:
        """Write the restart record of the failure just recorded; returns its id. It was
        seen at `seen_s` and decided at `decided_s`; `injected`: its replica got an injected
        fault this attempt; `snapshot_id`: the stacks taken for it (a hang)."""
        c = failure.classification
        self.restarts += 1
        return self.rec.restart(
            round=self.restarts,
            at_s=decided_s,
            replica=failure.replica,
            node=failure.node,
            error_code=error_code(c),
            error_message=c.message,
            error_source="injection" if injected and c.kind != "hang" else error_source(c),
            failure_class=c.failure_class.value if c.failure_class else None,
            rule=c.rule,
            decision=describe(decision),
            detect_ms=max(0.0, decided_s - seen_s) * 1000,
            fingerprint=c.fingerprint,
            matched_line=c.matched_line,
            cascade=", ".join(self._cascade) or None,
            snapshot_id=snapshot_id,
            isolated=self._isolation,
        )
