"""Table tests for --ft-args: AIMaster's flag string parsed into a spec's fault tolerance."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.errors import SpecError
from trainguard.spec.aimaster_flags import parse_ft_args
from trainguard.spec.models import (
    ExecutionMode,
    FaultTolerantPolicy,
    validate_spec,
)

POOL = {"command": ["python", "train.py"]}


# ---------------------------------------------------------------- parse_ft_args

AIMASTER = (
    "--job-execution-mode=Sync --enable-job-restart=True --max-num-of-job-restart=3 "
    "--fault-tolerant-policy=ExitCodeAndErrorMsg --enable-job-hang-detection=True "
    "--job-hang-interval=1800"
)
AIMASTER_FIELDS = {
    "execution_mode": "Sync",
    "enable_job_restart": True,
    "max_num_of_job_restart": "3",
    "fault_tolerant_policy": "ExitCodeAndErrorMsg",
    "enable_job_hang_detection": True,
    "job_hang_interval_s": "1800",
}


@pytest.mark.parametrize(
    "text",
    [
        AIMASTER,
        AIMASTER.replace("=", " "),
        "  " + AIMASTER.replace(" ", "\n") + "\n",
    ],
    ids=["equals", "spaces", "newlines"],
)
def test_parse_ft_args_aimaster_string(text: str) -> None:
    assert parse_ft_args(text) == AIMASTER_FIELDS


def test_parse_ft_args_validates_into_the_spec() -> None:
    data = {"name": "job", "worker_pools": [POOL], "fault_tolerance": parse_ft_args(AIMASTER)}
    spec = validate_spec(data)
    ft = spec.fault_tolerance
    assert ft.execution_mode is ExecutionMode.SYNC
    assert ft.enable_job_restart is True
    assert ft.max_num_of_job_restart == 3
    assert ft.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    assert ft.enable_job_hang_detection is True
    assert ft.job_hang_interval_s == 1800


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("--enable-job-restart", {"enable_job_restart": True}),
        (
            "--enable-job-restart --max-num-of-job-restart=-1",
            {"enable_job_restart": True, "max_num_of_job_restart": "-1"},
        ),
        ("--enable-job-restart=false", {"enable_job_restart": False}),
        ("--enable-job-restart False", {"enable_job_restart": False}),
        ("--enable-job-restart=0", {"enable_job_restart": False}),
        ("--enable-job-restart=yes", {"enable_job_restart": True}),
        ("--max-num-of-job-restart -1", {"max_num_of_job_restart": "-1"}),
        ("--max-tolerated-failure-rate=-1", {"max_tolerated_failure_rate": "-1"}),
        ("--job-execution-mode=Async", {"execution_mode": "Async"}),
        ("--fault-tolerant-policy 'OnFailure'", {"fault_tolerant_policy": "OnFailure"}),
        (
            "--enable-job-exit-hang-detection=True --job-exit-hang-interval=60",
            {"enable_job_exit_hang_detection": True, "job_exit_hang_interval_s": "60"},
        ),
        ("--enable-c4d-hang-detection=False", {"enable_c4d_hang_detection": False}),
        ("--max-num-of-same-error=4", {"max_num_of_same_error": "4"}),
    ],
)
def test_parse_ft_args_forms(text: str, expected: dict[str, Any]) -> None:
    assert parse_ft_args(text) == expected


@pytest.mark.parametrize(
    ("text", "first_line"),
    [
        ("--bogus=1", "--ft-args --bogus: unknown option (known: --job-execution-mode, "),
        (
            "--enable-job-restart=maybe",
            "--ft-args --enable-job-restart: must be True or False, got 'maybe'",
        ),
        ("--enable-job-restart=", "--ft-args --enable-job-restart: must be True or False, got ''"),
        (
            "job-execution-mode=Sync",
            "--ft-args: expected --name=value, got 'job-execution-mode=Sync'",
        ),
        ("--job-hang-interval", "--ft-args --job-hang-interval: needs a value"),
        ("--job-execution-mode='Sync", "--ft-args: cannot split"),
    ],
)
def test_parse_ft_args_errors(text: str, first_line: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_ft_args(text)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(first_line)


def test_parse_ft_args_reports_every_problem() -> None:
    with pytest.raises(SpecError) as info:
        parse_ft_args("--bogus=1 --enable-job-restart=maybe --job-execution-mode=Sync")
    assert len(info.value.problems) == 2
    assert info.value.problems[0].startswith("--ft-args --bogus: unknown option")
    assert info.value.problems[1] == (
        "--ft-args --enable-job-restart: must be True or False, got 'maybe'"
    )
