"""trainguard: a self-hosted fault-tolerance master for distributed training jobs."""

__version__ = "0.1.0"
