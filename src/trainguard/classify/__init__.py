"""What a failure is (R-CLS-1..3): the kind of exit and its class, read from the log tail
(phase, tracebacks, context), the signature catalogue (`signatures.yaml`, data), the
learned second opinion (`learned_model.json`), fingerprints, what the machine said and
what a script's output says of its progress. Pure: no process, clock or network; what is
*done* about a failure is `trainguard.policy`'s.
"""

__all__ = [
    "catalogue",
    "classes",
    "evidence",
    "exits",
    "fingerprint",
    "learned",
    "logcontext",
    "logtail",
    "machine",
    "machine_parse",
    "own_errors",
    "progress_text",
    "readings",
]
