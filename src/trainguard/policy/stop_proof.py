"""What proved a failure permanent, in words, for the decision that ends a job (issue 38).

A job ends at once only on proof; every `FailJob` names it, in `explain` and at the end
of the job's error message: the rule that read the log (and what that rule means: a bug
of the job's code, a set-up error, a resource a person must fix), a recurrence the
history rule saw, or the limit that was spent. Pure: the catalogue is data.
"""

from __future__ import annotations

from functools import cache

from trainguard.classify.catalogue import builtin_catalogue
from trainguard.classify.classes import Classification

_NOT_IN_CATALOGUE: dict[str, str] = {
    "python-traceback": "an uncaught exception in the job's code",
    "collective-mismatch": "the ranks disagree on a collective, a bug",
    "host-oom-cgroup": "the kernel's OOM killer in the replica's cgroup: it needs more memory",
    "child-killed-under-launcher": "one child SIGKILLed, as the kernel's OOM killer does",
    "killed-by-the-kernel": "a SIGKILL the shell reported, most often the OOM killer",
    "spawn-error": "the command cannot be started",
}
_UNTRAINED = "-untrained"


@cache
def _meanings() -> dict[str, str]:
    out = {}
    for sig in builtin_catalogue():
        out[sig.id] = sig.reason
        if sig.untrained is not None:
            out[sig.id + _UNTRAINED] = sig.untrained.reason
    return out


def rule_meaning(rule: str) -> str | None:
    """What a classification rule stands for (None: a rule with no fixed meaning)."""
    if rule.startswith("crash-with-cause-"):
        return "a crash that follows a deterministic cause in the log"
    return _meanings().get(rule) or _NOT_IN_CATALOGUE.get(rule)


def rule_proof(c: Classification) -> str:
    """The proof a permanent reading rests on: its rule, what it means, and how sure."""
    meaning = rule_meaning(c.rule)
    text = f"rule {c.rule}" + (f", {meaning}" if meaning else "")
    if c.uncertain:
        text += f" (uncertain: confidence {c.confidence:.2f})"
    return text


def with_proof(message: str, proof: str) -> str:
    """The job's error message with its proof at the end."""
    return f"{message} (proof: {proof})" if proof else message
