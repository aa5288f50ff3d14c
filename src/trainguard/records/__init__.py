"""The durable record: the store (SQLite or PostgreSQL) and its typed rows, the recorder the
master writes through, queries and views the readers use, explain, goodput, liveness of
masters, job control. (Checkpoint files and snapshots of the training state are
`trainguard.storage`'s: the SDK reads them without any of this.)
"""

__all__ = [
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
    "store",
    "views",
]
