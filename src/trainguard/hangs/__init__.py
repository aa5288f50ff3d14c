"""Hang detection and diagnosis: the watch over signs of life, stack dumps, their parsers and
the culprit rules, and stragglers (each replica's pace, from its heartbeats).
"""

__all__ = [
    "diagnose",
    "group_watch",
    "stack_dumps",
    "stack_model",
    "stack_parsers",
    "stacks",
    "stragglers",
    "watch",
]
