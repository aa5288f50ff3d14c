"""The durable record: the store (SQLite or PostgreSQL) and its typed rows, the recorder the
master writes through, queries and views the readers use, explain, goodput, liveness of
masters, job control and checkpoint storage.
"""

__all__ = [
    "checkpoints",
    "control",
    "engine",
    "explain",
    "goodput",
    "liveness",
    "queries",
    "recorder",
    "rows",
    "schema",
    "store",
    "views",
]
