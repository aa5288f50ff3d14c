"""Pure decisions: what is retried and how. Decisions as values (`actions`), budgets,
backoff, verdicts on exits, hangs and starts, the node check and probation, the proof a
stop names. What a failure *is* comes from `trainguard.classify`. No process, clock or
network.
"""

__all__ = [
    "actions",
    "backoff",
    "budgets",
    "decisions",
    "gpus",
    "job_rules",
    "node_check",
    "outcome",
    "probation",
    "stop_proof",
    "verdicts",
]
