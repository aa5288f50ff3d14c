"""The job spec: validated models, limits, the bounded YAML reader, the AIMaster flag parser and the
injection and notification rules as configuration. Imports only `errors`.
"""

__all__ = [
    "aimaster_flags",
    "frameworks",
    "injection",
    "models",
    "notify_rules",
    "safe_yaml",
    "sizes",
]
