"""AIMaster's SDK surface (PAI-DLC), for scripts written for it: change the import line
`from aimaster import job_monitor as jm` to `from trainguard.aimaster import job_monitor as jm`
and the rest runs as written. See `job_monitor`."""

__all__ = ["job_monitor"]
