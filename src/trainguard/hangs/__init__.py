"""Hang detection and diagnosis: the watch over signs of life, stack snapshots, their parsers and
the culprit rules, and progress estimates.
"""

__all__ = [
    "diagnose",
    "group_watch",
    "progress",
    "snapshot",
    "stack_model",
    "stack_parsers",
    "stacks",
    "watch",
]
