"""What training code calls. Standard library only: it must import in milliseconds.

For now: `set_retryable_errors([...])`, which tells the master which error texts of
this job are worth a retry. Outside trainguard every call is a no-op (one warning).
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

_warned = False


def _outside() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "trainguard.sdk: not running under trainguard; calls do nothing", stacklevel=3
        )


def set_retryable_errors(patterns: list[str]) -> None:
    """Failures whose log matches one of these regexes (or keywords) are retried."""
    where = os.environ.get("TRAINGUARD_RETRYABLE_ERRORS_DIR")
    replica = os.environ.get("TRAINGUARD_REPLICA", "replica")
    if not where:
        _outside()
        return
    folder = Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{replica}.")
    with os.fdopen(fd, "w") as fh:
        json.dump([str(p) for p in patterns], fh)
    os.replace(tmp, folder / f"{replica}.json")
