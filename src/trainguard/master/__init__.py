"""The master of one job: the loop that executes the policy's decisions (`loop`), the one
explicit job state it holds (`state`), the actions its handlers take through (`actions`),
the handlers themselves (`attempts`, `exits`, `groups`, `hang_response`, `faults`, over
`failures`; put together in `wiring`), the journal that records its transitions, its
inbox of replica events, the ledger of what happened, fault injection, checkpoint and
snapshot keeping, the replicas' SDK channel, and the runner that wires a job to a backend
and a store.
"""

__all__ = [
    "actions",
    "attempts",
    "events",
    "exits",
    "failures",
    "faults",
    "groups",
    "hang_response",
    "inbox",
    "inject",
    "journal",
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
    "state",
    "wiring",
]
