"""What a job's backend needs of the machine `trainguard run` starts on, checked before the
job is stored (issue 37): a job that cannot start here is refused with one line (exit 2),
never recorded and then failed as an internal error, attempt after attempt."""

from __future__ import annotations

import os
from collections.abc import Mapping

from trainguard.backends.slurm.cluster import SlurmError, allocation_from_env
from trainguard.errors import SpecError

RAY_EXTRA = "pip install trainguard[ray]"


def backend_problem(backend: str, env: Mapping[str, str] | None = None) -> str | None:
    """Why `backend` cannot run a job from this process, or None.

    slurm: the process must run inside an allocation (its SLURM_* variables); ray: `ray`
    must import (a real import: a package that is there but broken fails as surely)."""
    if backend == "slurm":
        try:
            allocation_from_env(os.environ if env is None else env)
        except SlurmError as exc:
            return str(exc)
    elif backend == "ray":
        try:
            import ray  # noqa: F401  (the backend imports it anyway: paid once)
        except ImportError as exc:
            return f"backend ray needs Ray, and `import ray` fails here ({exc}): {RAY_EXTRA}"
    return None


def refuse_unless_ready(backend: str) -> None:
    """SpecError (one line, exit 2) where the spec's backend cannot run from here: before
    anything is stored, so nothing is left INTERRUPTED or failed attempt after attempt."""
    problem = backend_problem(backend)
    if problem is not None:
        raise SpecError([problem])
