"""The master of one job: the loop that executes the policy's decisions (`loop`, over the
shared state in `core` and its handlers for attempts, exits, hangs and faults), its inbox
of replica events, the ledger of what happened, fault injection, checkpoint and snapshot
keeping, the replicas' SDK channel, and the runner that wires a job to a backend and a store.
"""

__all__ = [
    "attempts",
    "core",
    "events",
    "exits",
    "faults",
    "groups",
    "hang_response",
    "inbox",
    "inject",
    "keeper",
    "launch",
    "ledger",
    "loop",
    "moves",
    "node_check",
    "node_ledger",
    "output_progress",
    "runner",
    "sdk_channel",
    "sdk_wire",
    "snapshot_keeper",
]
