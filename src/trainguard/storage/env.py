"""The environment variables the master (and its node agents) sets in each replica, and the
training process reads: one spelling, here, for both sides. The SDK re-exports those its
callers may want (`sdk.ENV_CHECKPOINT_DIR`, ...)."""

from __future__ import annotations

# Where the SDK's messages go, and who sends them.
ENV_MASTER_URL = "TRAINGUARD_MASTER_URL"
ENV_TOKEN = "TRAINGUARD_TOKEN"
ENV_REPLICA = "TRAINGUARD_REPLICA"
ENV_JOB_ID = "TRAINGUARD_JOB_ID"
ENV_RESTART_COUNT = "TRAINGUARD_RESTART_COUNT"
ENV_ATTEMPT = "TRAINGUARD_ATTEMPT"

# Checkpoints and snapshots of the training state (`storage.checkpoints`, `storage.snapshots`).
ENV_CHECKPOINT_DIR = "TRAINGUARD_CHECKPOINT_DIR"
ENV_SNAPSHOT_DIR = "TRAINGUARD_SNAPSHOT_DIR"
ENV_SNAPSHOT_PERSIST_EVERY = "TRAINGUARD_SNAPSHOT_PERSIST_EVERY"
ENV_STORAGE_CHECK = "TRAINGUARD_STORAGE_CHECK"
"""The token of the marker the master wrote into the checkpoint storage (a host that cannot
read it back does not see the job's storage: `backends.storage_check`)."""

ENV_FAULTHANDLER_FILE = "TRAINGUARD_FAULTHANDLER_FILE"
"""Where a replica's faulthandler writes its stacks on SIGUSR2 (py-spy's fallback)."""
