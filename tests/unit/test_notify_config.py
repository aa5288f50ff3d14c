"""Notification rules as configuration, and webhook signing: pure, no servers."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.notify.signing import sign, verify
from trainguard.spec.notify_rules import NotifyRule


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sink": "webhook"}, "url: a webhook rule needs a url"),
        ({"sink": "apprise"}, "url: an apprise rule needs a url"),
        ({"sink": "webhook", "url": "ftp://x/y"}, "url: a webhook url must start with http"),
        ({"sink": "command"}, "command: a command rule needs a program"),
        ({"sink": "command", "command": [""]}, r"command: .* got \[''\]"),
        ({"sink": "command", "command": ["x"], "events": []}, r"events: .* got \[\]"),
        ({"sink": "command", "command": ["x"], "states": ["FAILD"]}, "states: 'FAILD' is not a"),
        (
            {"sink": "webhook", "url": "http://h", "secret": "s", "secret_env": "S"},
            "secret_env: set secret or secret_env, not both",
        ),
    ],
)
def test_rule_validation_names_field_and_value(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NotifyRule(**fields)


def test_rule_errors_read_well_inside_a_job_spec() -> None:
    from trainguard.errors import SpecError
    from trainguard.spec.models import validate_spec

    pools = [{"role": "worker", "replicas": 1, "command": ["x"]}]
    rules = [{"sink": "webhook"}, {"sink": "command", "command": ["x"], "states": ["FAILD"]}]
    with pytest.raises(SpecError) as err:
        validate_spec({"name": "a", "worker_pools": pools, "notifications": rules})
    text = str(err.value)
    assert "notifications[0].url: a webhook rule needs a url" in text
    assert "notifications[1].states: 'FAILD' is not a job state" in text


def test_rule_states_are_normalised() -> None:
    rule = NotifyRule(sink="command", command=["x"], states=["failed", " Succeeded "])
    assert rule.states == ["FAILED", "SUCCEEDED"]


def test_sign_and_verify() -> None:
    body = b'{"event":"hang"}'
    header = sign("s3cret", body)
    assert header.startswith("sha256=") and len(header) == len("sha256=") + 64
    assert verify("s3cret", body, header)
    assert not verify("wrong", body, header)
    assert not verify("s3cret", body + b" ", header)
    assert not verify("s3cret", body, None)
    assert not verify("s3cret", body, "sha256=é")
