"""The node check before a suspicious retry: the script each node runs (`worker`) and what
starts it on every node at once and reads its answers (`run`); the judging is
`trainguard.policy.node_check`."""

__all__ = ["run", "worker"]
