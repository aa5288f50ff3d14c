"""The master of one job: the loop that executes the policy"s decisions, its inbox of replica
events, the ledger of what happened, fault injection, checkpoint keeping, the replicas" SDK
channel, and the runner that wires a job to a backend and a store.
"""

__all__ = [
    "events",
    "inbox",
    "inject",
    "keeper",
    "launch",
    "ledger",
    "loop",
    "runner",
    "sdk_channel",
]
