"""Files on disk that the SDK and the master share, standard library only (training
processes, node agents and replicas' helpers import it): checkpoints committed into the
job's storage, snapshots of the training state in shared memory, folders and files of
this user's only, the `TRAINGUARD_*` environment names, fresh job ids and tokens.

Importing any of it must not pull the master, the backends or the policy into a training
process (tests/e2e/test_storage_layer.py counts the modules).
"""

__all__ = [
    "checkpoint_copy",
    "checkpoints",
    "env",
    "ids",
    "private",
    "snapshot_state",
    "snapshots",
]
