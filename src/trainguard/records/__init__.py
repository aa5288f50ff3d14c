"""The durable record: the store (SQLite or PostgreSQL) and its typed rows, the recorder the
master writes through, queries and views the readers use, explain, goodput, liveness of
masters, job control, checkpoint storage, and in-memory snapshots (their files and the
training states in them).
"""

__all__ = [
    "checkpoint_copy",
    "checkpoints",
    "control",
    "engine",
    "explain",
    "goodput",
    "liveness",
    "nodes",
    "queries",
    "recorder",
    "rows",
    "schema",
    "snapshot_state",
    "snapshots",
    "store",
    "views",
]
