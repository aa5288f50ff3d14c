"""The job spec: validated models, their limits, validation problems as lines, the bounded
YAML reader and tail reader, text checks (UTF-8, values cut short for messages), the one
table of what a flag sets (CLI, AIMaster, older spellings), the AIMaster flag parser and
the injection and notification rules as configuration. Imports only `errors`.
"""

__all__ = [
    "aimaster_flags",
    "base",
    "bounded_read",
    "engines",
    "fault_tolerance",
    "fields",
    "frameworks",
    "injection",
    "limits",
    "models",
    "node_probation",
    "notify_rules",
    "problems",
    "progress",
    "safe_yaml",
    "sections",
    "sizes",
    "text",
]
