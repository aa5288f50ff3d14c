"""Pure decisions: classification, its catalogue and the learned second opinion (a model
file shipped with the package), fingerprints, budgets and what to do about a failure, a
clean exit, a hang or a start. No process, clock or network.
"""

__all__ = [
    "actions",
    "backoff",
    "budgets",
    "catalogue",
    "classes",
    "classify",
    "decisions",
    "evidence",
    "fingerprint",
    "gpus",
    "learned",
    "logcontext",
    "logtail",
    "machine",
    "machine_parse",
    "node_check",
    "outcome",
    "own_errors",
    "probation",
    "progress_text",
    "readings",
    "stop_proof",
    "verdicts",
]
