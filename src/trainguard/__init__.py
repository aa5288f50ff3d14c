"""trainguard: a self-hosted fault-tolerance master for distributed training jobs.

This package namespace stays empty on purpose: training processes will import the SDK
from it, and that import must take milliseconds, not pull in pydantic or SQLAlchemy.
The CLI lives in `trainguard.cli.main`, the job spec in `trainguard.spec.models`.
"""

__version__ = "0.1.0"
