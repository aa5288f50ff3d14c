"""The durable record: the store (SQLite or PostgreSQL), the recorder the master writes through,
queries and views the readers use, explain, goodput, liveness of masters, job control and
checkpoint storage.
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
    "schema",
    "store",
    "views",
]
