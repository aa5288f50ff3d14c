"""Pure decisions: classification, its catalogue and the learned second opinion (a model
file shipped with the package), fingerprints, budgets and what to do about a failure, a
clean exit, a hang or a start. No process, clock or network.
"""

__all__ = [
    "actions",
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
    "own_errors",
    "progress_text",
    "verdicts",
]
