"""Pure decisions: classification and its catalogue, fingerprints, budgets and
what to do about a failure, a clean exit, a hang or a start. No process, file or clock.
"""

__all__ = [
    "budgets",
    "catalogue",
    "classes",
    "classify",
    "decisions",
    "evidence",
    "fingerprint",
    "gpus",
    "logcontext",
    "logtail",
    "verdicts",
]
