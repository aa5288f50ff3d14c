"""Table tests for the job spec: defaults, validation, and one problem line per mistake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.errors import SpecError
from trainguard.spec.frameworks import RULES
from trainguard.spec.models import (
    ExecutionMode,
    FaultTolerantPolicy,
    SuccessPolicy,
    load_spec_file,
    validate_spec,
)

POOL = {"command": ["python", "train.py"]}


def _spec(**kw: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "job", "worker_pools": [dict(POOL)]}
    data.update(kw)
    return data


def _problems(data: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        validate_spec(data)
    return info.value.problems


# ---------------------------------------------------------------- validate_spec


def test_minimal_spec_gets_defaults() -> None:
    spec = validate_spec({"name": "job", "worker_pools": [{"command": ["python", "train.py"]}]})
    assert spec.name == "job"
    assert spec.framework == "pytorch"
    assert spec.success_policy is SuccessPolicy.CHIEF
    assert spec.world_size == 1
    (pool,) = spec.worker_pools
    assert pool.role == "worker"
    assert pool.replicas == 1
    assert pool.command == ["python", "train.py"]
    assert pool.env == {}
    ft = spec.fault_tolerance
    assert ft.execution_mode is ExecutionMode.SYNC
    assert ft.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    assert ft.enable_job_restart is True
    assert ft.max_num_of_job_restart == 3
    assert ft.max_replica_restarts == 5
    assert ft.max_transient_restarts == 3
    assert ft.max_capacity_restarts == 3
    assert ft.max_internal_restarts == 2
    assert ft.max_num_of_same_error == 10
    assert ft.max_tolerated_failure_rate is None
    assert ft.enable_job_hang_detection is True  # off in AIMaster; on here (harmless at 1800 s)
    assert ft.job_hang_interval_s == 1800


@pytest.mark.parametrize(
    ("data", "problems"),
    [
        (
            {"name": "job", "worker_pools": [{"command": ["x"], "replicas": 0}]},
            ["worker_pools[0].replicas: must be >= 1, got 0"],
        ),
        (
            {"name": "job", "worker_pools": [{"command": ["x"], "replicas": 5000}]},
            ["worker_pools[0].replicas: must be <= 4096, got 5000"],
        ),
        (_spec(bogus=1), ["bogus: unknown field"]),
        (
            {"name": "job", "worker_pools": [{"command": ["x"], "bogus": 1}]},
            ["worker_pools[0].bogus: unknown field"],
        ),
        (
            _spec(fault_tolerance={"max_restarts": 3}),
            ["fault_tolerance.max_restarts: unknown field"],
        ),
        (
            _spec(fault_tolerance={"execution_mode": "bogus"}),
            ["fault_tolerance.execution_mode: must be one of 'sync' or 'async', got 'bogus'"],
        ),
        (
            _spec(fault_tolerance={"fault_tolerant_policy": "Sometimes"}),
            [
                "fault_tolerance.fault_tolerant_policy: must be one of 'OnFailure', "
                "'ExitCodeAndErrorMsg' or 'Never', got 'Sometimes'"
            ],
        ),
        (
            _spec(success_policy="most"),
            ["success_policy: must be one of 'chief' or 'all', got 'most'"],
        ),
        (
            _spec(framework="tf"),
            [
                "framework: must be one of 'pytorch', 'tensorflow', 'mpi', 'batch', 'torchft' or "
                "'generic', got 'tf'"
            ],
        ),
        (
            {"name": "job", "worker_pools": [{"replicas": 2}]},
            ["worker_pools[0].command: is required"],
        ),
        (
            {"name": "job", "worker_pools": [{"command": []}]},
            ["worker_pools[0].command: must have at least 1 item(s), got []"],
        ),
        (
            {"name": "job", "worker_pools": [{"command": [" "]}]},
            ["worker_pools[0].command[0]: must name a program, got ''"],
        ),
        (
            {"name": "job", "worker_pools": [{"command": ["x"]}, {"command": ["y"]}]},
            ["worker_pools: role names must be unique, got 'worker' twice"],
        ),
        (
            {
                "name": "job",
                "worker_pools": [
                    {"role": "chief", "replicas": 2, "command": ["x"]},
                    {"command": ["y"]},
                ],
            },
            ["worker_pools: the chief pool must have exactly 1 replica"],
        ),
        (
            {"name": "job", "worker_pools": [{"role": "Worker", "command": ["x"]}]},
            ["worker_pools[0].role: must match ^[a-z][a-z0-9_-]{0,31}$, got 'Worker'"],
        ),
        (
            {"name": "job", "worker_pools": [{"command": ["x"], "resources": {"memory": "lots"}}]},
            ["worker_pools[0].resources.memory: must be a size such as 4Gi or 512M, got 'lots'"],
        ),
        (
            {"name": "job", "worker_pools": []},
            ["worker_pools: must have at least 1 item(s), got []"],
        ),
        ({"worker_pools": [POOL]}, ["name: is required"]),
        (
            {"name": "bad name", "worker_pools": [POOL]},
            ["name: must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$, got 'bad name'"],
        ),
        (
            _spec(fault_tolerance={"max_num_of_job_restart": "x"}),
            [
                "fault_tolerance.max_num_of_job_restart: must be a whole number "
                "from 0 to 1000000000, "
                "or 'unlimited' (or -1), got 'x'"
            ],
        ),
        (
            _spec(fault_tolerance={"max_replica_restarts": -2}),
            [
                "fault_tolerance.max_replica_restarts: must be a whole number "
                "from 0 to 1000000000, "
                "or 'unlimited' (or -1), got -2"
            ],
        ),
        (
            _spec(fault_tolerance={"max_transient_restarts": True}),
            [
                "fault_tolerance.max_transient_restarts: must be a whole number "
                "from 0 to 1000000000, "
                "or 'unlimited' (or -1), got True"
            ],
        ),
        (
            _spec(fault_tolerance={"max_tolerated_failure_rate": 2}),
            ["fault_tolerance.max_tolerated_failure_rate: must be <= 1, got 2"],
        ),
        (
            _spec(fault_tolerance={"job_hang_interval_s": 0}),
            ["fault_tolerance.job_hang_interval_s: must be >= 0.5, got 0"],
        ),
        ([POOL], ["job spec: must be a mapping, got list"]),
        (None, ["job spec: must be a mapping, got NoneType"]),
    ],
)
def test_bad_spec_problem_lines(data: Any, problems: list[str]) -> None:
    assert _problems(data) == problems


def test_every_problem_is_reported() -> None:
    data = {
        "name": "job",
        "worker_pools": [{"command": ["x"], "replicas": 0}],
        "fault_tolerance": {"max_num_of_job_restart": "x", "execution_mode": "sometimes"},
        "bogus": True,
    }
    problems = _problems(data)
    assert len(problems) == 4
    assert "worker_pools[0].replicas: must be >= 1, got 0" in problems
    assert "bogus: unknown field" in problems
    assert sum(p.startswith("fault_tolerance.max_num_of_job_restart: ") for p in problems) == 1
    assert sum(p.startswith("fault_tolerance.execution_mode: ") for p in problems) == 1


@pytest.mark.parametrize(
    "field",
    [
        "max_num_of_job_restart",
        "max_replica_restarts",
        "max_num_of_same_error",
        "max_transient_restarts",
        "max_capacity_restarts",
        "max_internal_restarts",
    ],
)
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-1, "unlimited"),
        ("-1", "unlimited"),
        ("unlimited", "unlimited"),
        ("Unlimited", "unlimited"),
        ("inf", "unlimited"),
        (0, 0),
        (7, 7),
        ("7", 7),
    ],
)
def test_limits(field: str, value: Any, expected: Any) -> None:
    spec = validate_spec(_spec(fault_tolerance={field: value}))
    assert getattr(spec.fault_tolerance, field) == expected


@pytest.mark.parametrize(
    "field", ["max_num_of_job_restart", "max_replica_restarts", "max_internal_restarts"]
)
@pytest.mark.parametrize("value", ["x", "3.5", 3.5, -5, "", None, [3]])
def test_bad_limit_is_one_line_naming_the_field(field: str, value: Any) -> None:
    problems = _problems(_spec(fault_tolerance={field: value}))
    assert len(problems) == 1
    assert problems[0].startswith(f"fault_tolerance.{field}: ")
    assert repr(value) in problems[0]


@pytest.mark.parametrize(
    ("ft", "mode", "policy"),
    [
        (
            {"execution_mode": "Sync"},
            ExecutionMode.SYNC,
            FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG,
        ),
        (
            {"execution_mode": "ASYNC"},
            ExecutionMode.ASYNC,
            FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG,
        ),
        (
            {"execution_mode": " async "},
            ExecutionMode.ASYNC,
            FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG,
        ),
        (
            {"fault_tolerant_policy": "onfailure"},
            ExecutionMode.SYNC,
            FaultTolerantPolicy.ON_FAILURE,
        ),
        (
            {"fault_tolerant_policy": "ONFAILURE"},
            ExecutionMode.SYNC,
            FaultTolerantPolicy.ON_FAILURE,
        ),
        ({"fault_tolerant_policy": "never"}, ExecutionMode.SYNC, FaultTolerantPolicy.NEVER),
        (
            {"fault_tolerant_policy": "exitcodeanderrormsg"},
            ExecutionMode.SYNC,
            FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG,
        ),
    ],
)
def test_enums_are_case_insensitive(
    ft: dict[str, str], mode: ExecutionMode, policy: FaultTolerantPolicy
) -> None:
    spec = validate_spec(_spec(fault_tolerance=ft))
    assert spec.fault_tolerance.execution_mode is mode
    assert spec.fault_tolerance.fault_tolerant_policy is policy


@pytest.mark.parametrize(
    ("value", "expected"), [("ALL", SuccessPolicy.ALL), ("Chief", SuccessPolicy.CHIEF)]
)
def test_success_policy_case_insensitive(value: str, expected: SuccessPolicy) -> None:
    assert validate_spec(_spec(success_policy=value)).success_policy is expected


@pytest.mark.parametrize(
    ("value", "expected"), [(-1, None), ("-1", None), (0.5, 0.5), ("0.25", 0.25)]
)
def test_max_tolerated_failure_rate(value: Any, expected: float | None) -> None:
    spec = validate_spec(_spec(fault_tolerance={"max_tolerated_failure_rate": value}))
    assert spec.fault_tolerance.max_tolerated_failure_rate == expected


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ("job_hang_interval", "job_hang_interval_s"),
        ("job_exit_hang_interval", "job_exit_hang_interval_s"),
    ],
)
@pytest.mark.parametrize("framework", ["pytorch", "batch"])  # batch: a preset's defaults too
def test_a_duration_keeps_its_older_spelling(given: str, field: str, framework: str) -> None:
    """AIMaster's (and trainguard's former) spelling still sets the field, and a problem
    names the key as the spec wrote it."""
    spec = validate_spec(_spec(framework=framework, fault_tolerance={given: 42}))
    assert getattr(spec.fault_tolerance, field) == 42
    assert _problems(_spec(fault_tolerance={given: 0})) == [
        f"fault_tolerance.{given}: must be >= 0.5, got 0"
    ]
    assert _problems(_spec(fault_tolerance={given: True})) == [
        f"fault_tolerance.{given}: must be a number, got true"
    ]
    assert _problems(_spec(fault_tolerance={given: 5, field: 6})) == [
        f"fault_tolerance.{field}: given twice, also as {given}; give one of them"
    ]


def test_a_presets_default_never_meets_an_older_spelling_of_its_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = type(RULES["batch"])
    monkeypatch.setattr(batch, "ft_defaults", {**batch.ft_defaults, "job_hang_interval_s": 99})
    spec = validate_spec(_spec(framework="batch", fault_tolerance={"job_hang_interval": 42}))
    assert spec.fault_tolerance.job_hang_interval_s == 42
    assert validate_spec(_spec(framework="batch")).fault_tolerance.job_hang_interval_s == 99


@pytest.mark.parametrize("off", [False, "False", "false"])
def test_c4d_off_is_accepted_as_what_trainguard_does(off: Any) -> None:
    spec = validate_spec(_spec(fault_tolerance={"enable_c4d_hang_detection": off}))
    assert spec.fault_tolerance == validate_spec(_spec()).fault_tolerance


@pytest.mark.parametrize("on", [True, "True", 1])
def test_c4d_on_is_refused_saying_why(on: Any) -> None:
    (line,) = _problems(_spec(fault_tolerance={"enable_c4d_hang_detection": on}))
    assert line.startswith("fault_tolerance.enable_c4d_hang_detection: C4D is Alibaba Cloud's")
    assert "trainguard has none" in line


def test_spec_is_frozen() -> None:
    spec = validate_spec(_spec())
    with pytest.raises(ValueError):
        spec.name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------- load_spec_file


def test_load_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: job\nworker_pools:\n  - command: [python, train.py]\n    replicas: 2\n")
    data = load_spec_file(path)
    assert data == {
        "name": "job",
        "worker_pools": [{"command": ["python", "train.py"], "replicas": 2}],
    }
    assert validate_spec(data).world_size == 2


def test_load_spec_file_missing(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert info.value.problems == [f"{path}: cannot read the job spec (No such file or directory)"]


def test_load_spec_file_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: job\nworker_pools: [\n  - command: x\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    (line,) = info.value.problems
    assert line.startswith(f"{path}: not valid YAML")
    assert str(path) in str(info.value)


def test_load_spec_file_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert info.value.problems == [f"{path}: a job spec must be a mapping, got list"]


def test_load_spec_file_json(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text('{"name": "job", "worker_pools": [{"command": ["x"]}]}')
    assert load_spec_file(path) == {"name": "job", "worker_pools": [{"command": ["x"]}]}


def test_problem_line_keeps_env_keys_starting_with_int() -> None:
    data = {"name": "job", "worker_pools": [{"command": ["x"], "env": {"interval": 5}}]}
    assert _problems(data) == [
        "worker_pools[0].env.interval: input should be a valid string, got 5"
    ]


def test_the_master_listens_on_one_address_of_the_cluster_never_all() -> None:
    for every in ("0.0.0.0", "::", "[::]"):
        (problem,) = _problems(_spec(backend="ray", ray={"driver_ip": every}))
        assert "ray.driver_ip" in problem and "every interface" in problem, problem
    spec = validate_spec(_spec(backend="ray", ray={"driver_ip": "10.0.0.5", "node_timeout_s": 5}))
    assert (spec.ray.driver_ip, spec.ray.node_timeout_s) == ("10.0.0.5", 5)
    (problem,) = _problems(_spec(backend="ray", ray={"node_timeout_s": 0}))
    assert "ray.node_timeout_s" in problem, problem
