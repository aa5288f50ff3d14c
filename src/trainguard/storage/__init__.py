"""Files on disk that every layer writes, standard library only (replicas' helpers and the
SDK import it too): folders and files of this user's only.
"""

__all__ = [
    "private",
]
