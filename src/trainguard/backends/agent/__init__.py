"""The node agent (issue 40): one supervisor per machine of a job, started by the backend,
that runs that machine's replicas (through the local backend: warm forks, logs, exits,
stacks) and tells the master what happens to them over one connection."""

__all__ = ["backend", "node", "protocol"]
