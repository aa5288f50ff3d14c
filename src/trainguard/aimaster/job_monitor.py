"""AIMaster's `job_monitor`, as its users write it, on trainguard's SDK.

    from trainguard.aimaster import job_monitor as jm
    monitor = jm.Monitor(config=jm.PyTorchConfig(job_hang_interval=1800))
    monitor.set_retryable_errors(["connect timeout"])
    monitor.reset_config(job_hang_interval=10)      # or reset_config({...}) / (**params)
    st = monitor.send_custom_message(content="The training loss of the job is NaN.")
    if not st.ok(): print(st.to_string())

    @jm.hang_detect(180)   # this function's scope only; -1: detection off within it
    def train(): ...

`job_hang_interval` is AIMaster's job-wide interval: no heartbeat or output from the job
for that long is a hang (trainguard's `fault_tolerance.job_hang_interval_s`, changed at
run time). Other AIMaster parameters are launch options here (`--ft-args`, the job spec):
given to a config they are kept and said once to have no effect at run time. Outside
trainguard every call does nothing and says so once (trainguard.sdk's warning), so the
same script runs under plain torchrun; the statuses then say nothing was sent.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from trainguard import sdk

RUNTIME_PARAMS = frozenset({"job_hang_interval"})
"""What a running job can change through the SDK; AIMaster's other parameters are set
where the job is launched."""

hang_detect = sdk.hang_detect
"""`@hang_detect(180)`, `@hang_detect(-1)`: the pattern AIMaster documents for staged hang
detection, as a decorator (and a context manager) for this function's scope only."""


class Status:
    """What AIMaster's calls return: `ok()` and `to_string()`."""

    def __init__(self, delivered: bool, what: str) -> None:
        self._ok, self._what = delivered, what

    def ok(self) -> bool:
        return self._ok

    def to_string(self) -> str:
        if self._ok:
            return f"OK: {self._what}"
        if not sdk.enabled():
            return f"not sent: {self._what}: not started by trainguard"
        return f"not sent: {self._what}: the trainguard master is unreachable"

    def __repr__(self) -> str:
        return f"Status({self.to_string()!r})"


class PyTorchConfig:
    """AIMaster's config of a PyTorch job: its parameters, as given."""

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = dict(params)


class TFConfig(PyTorchConfig):
    """AIMaster's config of a TensorFlow job."""


class Monitor:
    def __init__(self, config: PyTorchConfig | None = None) -> None:
        self.config = config if config is not None else PyTorchConfig()
        if self.config.params:
            self.reset_config(**self.config.params)

    def set_retryable_errors(self, errors: list[str]) -> Status:
        """Failures whose log tail holds one of these keywords are retried."""
        return Status(sdk.set_retryable_errors(list(errors)), "retryable errors set")

    def reset_config(self, params: Mapping[str, Any] | None = None, **kw: Any) -> Status:
        """AIMaster's `reset_config(params)` or `reset_config(**params)`: here the job's
        hang interval (`job_hang_interval`, seconds; -1 turns detection off)."""
        given = {**(params or {}), **kw}
        ignored = sorted(set(given) - RUNTIME_PARAMS)
        if ignored:
            warnings.warn(
                f"trainguard.aimaster: {', '.join(ignored)} cannot change while the job runs "
                "(set them in the job spec or --ft-args); ignored",
                sdk.SdkWarning,
                stacklevel=2,
            )
        if "job_hang_interval" not in given:
            return Status(True, "nothing to change at run time")
        seconds = given["job_hang_interval"]
        return Status(sdk.set_hang_interval(seconds), f"job_hang_interval {seconds}")

    def send_custom_message(self, content: str) -> Status:
        """A line for the job's record and its notifications."""
        return Status(sdk.send_custom_message(content), "custom message")
