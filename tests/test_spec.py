"""Table tests for the job spec, --ft-args, the CLI's spec building and the replica layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import _parser, _split_command, build_spec
from trainguard.errors import SpecError
from trainguard.ft_args import parse_ft_args
from trainguard.layout import plan_replicas, primary_replica, replica_env
from trainguard.spec import (
    ExecutionMode,
    FaultTolerantPolicy,
    JobSpec,
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
    assert ft.enable_job_hang_detection is False
    assert ft.job_hang_interval == 1800


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
        (_spec(framework="tf"), ["framework: must be one of 'pytorch' or 'generic', got 'tf'"]),
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
                "fault_tolerance.max_num_of_job_restart: must be a whole number >= 0, "
                "or 'unlimited' (or -1), got 'x'"
            ],
        ),
        (
            _spec(fault_tolerance={"max_replica_restarts": -2}),
            [
                "fault_tolerance.max_replica_restarts: must be a whole number >= 0, "
                "or 'unlimited' (or -1), got -2"
            ],
        ),
        (
            _spec(fault_tolerance={"max_transient_restarts": True}),
            [
                "fault_tolerance.max_transient_restarts: must be a whole number >= 0, "
                "or 'unlimited' (or -1), got True"
            ],
        ),
        (
            _spec(fault_tolerance={"max_tolerated_failure_rate": 2}),
            ["fault_tolerance.max_tolerated_failure_rate: must be <= 1.0, got 2"],
        ),
        (
            _spec(fault_tolerance={"job_hang_interval": 0}),
            ["fault_tolerance.job_hang_interval: must be > 0, got 0"],
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
    "job_hang_interval": "1800",
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
    spec = validate_spec(_spec(fault_tolerance=parse_ft_args(AIMASTER)))
    ft = spec.fault_tolerance
    assert ft.execution_mode is ExecutionMode.SYNC
    assert ft.enable_job_restart is True
    assert ft.max_num_of_job_restart == 3
    assert ft.fault_tolerant_policy is FaultTolerantPolicy.EXIT_CODE_AND_ERROR_MSG
    assert ft.enable_job_hang_detection is True
    assert ft.job_hang_interval == 1800


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
            {"enable_job_exit_hang_detection": True, "job_exit_hang_interval": "60"},
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


# ---------------------------------------------------------------- build_spec


def _build(*argv: str) -> JobSpec:
    """What `trainguard run ARGV` builds (as cli.main splits and parses it)."""
    head, command = _split_command(["run", *argv])
    args = _parser().parse_args(head)
    command = command or [c for c in args.command if c != "--"]
    return build_spec(args, command)


def _build_problems(*argv: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        _build(*argv)
    return info.value.problems


def test_build_spec_from_command() -> None:
    spec = _build("--nproc-per-node", "2", "--", "python", "x.py")
    assert spec.name == "x"
    (pool,) = spec.worker_pools
    assert pool.role == "worker"
    assert pool.replicas == 2
    assert pool.command == ["python", "x.py"]
    assert spec.world_size == 2
    assert spec.fault_tolerance.max_num_of_job_restart == 3


def test_build_spec_parse_args_remainder() -> None:
    # Parsed with the -- still in argv (argparse's REMAINDER), as the brief's form does.
    args = _parser().parse_args(["run", "--nproc", "3", "--", "python", "x.py", "--lr", "1"])
    command = [c for c in args.command if c != "--"]
    spec = build_spec(args, command)
    assert spec.worker_pools[0].replicas == 3
    assert spec.worker_pools[0].command == ["python", "x.py", "--lr", "1"]


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["python", "x.py"], "x"),
        (["python", "-u", "/opt/app/train_gpt.py", "--lr", "3"], "train_gpt"),
        (["./run.sh"], "run"),
        (["bash", "scripts/launch job.sh"], "launch-job"),
        (["torchrun"], "torchrun"),
        (["/usr/bin/env"], "env"),
    ],
)
def test_build_spec_default_name(command: list[str], name: str) -> None:
    assert _build("--", *command).name == name


def test_build_spec_job_name_flag() -> None:
    assert _build("--job-name", "mine", "--", "python", "x.py").name == "mine"


@pytest.mark.parametrize(
    ("argv", "field", "expected"),
    [
        (["--max-restarts", "5"], "max_num_of_job_restart", 5),
        (["--max-restarts", "unlimited"], "max_num_of_job_restart", "unlimited"),
        (["--max-restarts=-1"], "max_num_of_job_restart", "unlimited"),
        (["--enable-job-restart", "False"], "enable_job_restart", False),
        (["--enable-job-restart", "true"], "enable_job_restart", True),
        (["--execution-mode", "Async"], "execution_mode", ExecutionMode.ASYNC),
        (
            ["--fault-tolerant-policy", "onfailure"],
            "fault_tolerant_policy",
            FaultTolerantPolicy.ON_FAILURE,
        ),
        (["--max-replica-restarts", "2"], "max_replica_restarts", 2),
        (["--max-transient-restarts", "0"], "max_transient_restarts", 0),
        (["--stop-grace-period", "2.5"], "stop_grace_period_s", 2.5),
    ],
)
def test_build_spec_ft_flags(argv: list[str], field: str, expected: Any) -> None:
    spec = _build(*argv, "--", "python", "x.py")
    assert getattr(spec.fault_tolerance, field) == expected


def test_build_spec_other_flags() -> None:
    spec = _build(
        "--framework",
        "generic",
        "--success-policy",
        "all",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "--",
        "python",
        "x.py",
    )
    assert spec.framework == "generic"
    assert spec.success_policy is SuccessPolicy.ALL
    assert spec.worker_pools[0].env == {"A": "1", "B": "x=y"}


def _write_spec(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


SPEC_FT = """\
name: fromfile
fault_tolerance:
  max_num_of_job_restart: 1
  max_replica_restarts: 1
  execution_mode: async
  enable_job_restart: false
"""


def test_build_spec_file_alone(tmp_path: Path) -> None:
    f = _write_spec(tmp_path, SPEC_FT)
    spec = _build("-f", f, "--", "python", "x.py")
    assert spec.name == "fromfile"  # the file's name beats the command's default name
    ft = spec.fault_tolerance
    assert (ft.max_num_of_job_restart, ft.max_replica_restarts) == (1, 1)
    assert ft.execution_mode is ExecutionMode.ASYNC
    assert ft.enable_job_restart is False


def test_build_spec_ft_args_beat_file(tmp_path: Path) -> None:
    f = _write_spec(tmp_path, SPEC_FT)
    spec = _build(
        "-f",
        f,
        "--ft-args=--max-num-of-job-restart=2 --enable-job-restart=True",
        "--",
        "python",
        "x.py",
    )
    ft = spec.fault_tolerance
    assert ft.max_num_of_job_restart == 2  # --ft-args over the file
    assert ft.enable_job_restart is True  # --ft-args over the file
    assert ft.max_replica_restarts == 1  # the file, untouched
    assert ft.execution_mode is ExecutionMode.ASYNC  # the file, untouched


def test_build_spec_flags_beat_ft_args_and_file(tmp_path: Path) -> None:
    f = _write_spec(tmp_path, SPEC_FT)
    spec = _build(
        "-f",
        f,
        "--ft-args",
        "--max-num-of-job-restart=2 --job-execution-mode=Sync",
        "--max-restarts",
        "5",
        "--max-replica-restarts",
        "4",
        "--job-name",
        "fromflag",
        "--",
        "python",
        "x.py",
    )
    ft = spec.fault_tolerance
    assert ft.max_num_of_job_restart == 5  # flag over --ft-args over file
    assert ft.max_replica_restarts == 4  # flag over file
    assert ft.execution_mode is ExecutionMode.SYNC  # --ft-args over file
    assert ft.enable_job_restart is False  # file
    assert spec.name == "fromflag"


def test_build_spec_from_file_pools(tmp_path: Path) -> None:
    f = _write_spec(
        tmp_path,
        "name: pools\nworker_pools:\n"
        "  - role: chief\n    command: [python, c.py]\n"
        "  - role: worker\n    replicas: 3\n    command: [python, w.py]\n",
    )
    spec = _build("-f", f, "--env", "K=V")
    assert spec.name == "pools"
    assert [(p.role, p.replicas) for p in spec.worker_pools] == [("chief", 1), ("worker", 3)]
    assert all(p.env == {"K": "V"} for p in spec.worker_pools)


@pytest.mark.parametrize("argv", [(), ("--nproc-per-node", "2"), ("--max-restarts", "1")])
def test_build_spec_without_command_or_spec(argv: tuple[str, ...]) -> None:
    problems = _build_problems(*argv)
    assert len(problems) == 1
    assert problems[0].startswith("command: none given")
    assert "command" in problems[0]


def test_build_spec_command_and_spec_pools(tmp_path: Path) -> None:
    f = _write_spec(tmp_path, "name: j\nworker_pools:\n  - command: [x]\n")
    assert _build_problems("-f", f, "--", "python", "x.py") == [
        "command: give either a spec with worker_pools or a command, not both"
    ]


def test_build_spec_nproc_with_spec_pools(tmp_path: Path) -> None:
    f = _write_spec(tmp_path, "name: j\nworker_pools:\n  - command: [x]\n")
    assert _build_problems("-f", f, "--nproc", "2") == [
        "--nproc-per-node: applies to a command, not to a spec's worker_pools"
    ]


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--env", "NOEQUALS"), "--env: must be KEY=VALUE, got 'NOEQUALS'"),
        (("--env", "=v"), "--env: must be KEY=VALUE, got '=v'"),
        (("--nproc", "0"), "worker_pools[0].replicas: must be >= 1, got '0'"),
    ],
)
def test_build_spec_bad_flags(argv: tuple[str, ...], problem: str) -> None:
    assert _build_problems(*argv, "--", "python", "x.py") == [problem]


def test_build_spec_bad_ft_args() -> None:
    problems = _build_problems("--ft-args=--nope=1", "--", "python", "x.py")
    assert len(problems) == 1
    assert problems[0].startswith("--ft-args --nope: unknown option")


def test_build_spec_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    problems = _build_problems("-f", str(path), "--", "python", "x.py")
    assert problems == [f"{path}: cannot read the job spec (No such file or directory)"]


# ---------------------------------------------------------------- layout


def _pools_spec() -> JobSpec:
    # The chief pool is listed last on purpose: it still comes first.
    return validate_spec(
        {
            "name": "job",
            "worker_pools": [
                {"role": "worker", "replicas": 2, "command": ["python", "w.py"], "env": {"W": "1"}},
                {"role": "chief", "command": ["python", "c.py"]},
                {"role": "evaluator", "command": ["python", "e.py"]},
            ],
        }
    )


def test_plan_replicas_chief_first() -> None:
    plans = plan_replicas(_pools_spec())
    assert [(p.name, p.role, p.index, p.rank) for p in plans] == [
        ("chief-0", "chief", 0, 0),
        ("worker-0", "worker", 0, 1),
        ("worker-1", "worker", 1, 2),
        ("evaluator-0", "evaluator", 0, 3),
    ]
    assert plans[0].argv == ("python", "c.py")
    assert plans[1].argv == ("python", "w.py")
    assert plans[1].env == (("W", "1"),)
    assert plans[0].env == ()
    assert primary_replica(plans) == "chief-0"


def test_plan_replicas_workers_only() -> None:
    spec = _build("--nproc", "3", "--", "python", "x.py")
    plans = plan_replicas(spec)
    assert [p.name for p in plans] == ["worker-0", "worker-1", "worker-2"]
    assert [p.rank for p in plans] == [0, 1, 2]
    assert primary_replica(plans) == "worker-0"


def test_replica_env() -> None:
    plans = plan_replicas(_pools_spec())
    env = replica_env(
        plans[2],
        job_id="job-abc",
        world_size=4,
        master_addr="127.0.0.1",
        master_port=29500,
        restart_count=2,
        max_restarts=3,
        role_world_size=2,
        sdk_env={"TRAINGUARD_SDK": "on"},
    )
    expected = {
        "RANK": "2",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "worker",
        "ROLE_RANK": "1",
        "ROLE_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "job-abc",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TRAINGUARD_JOB_ID": "job-abc",
        "TRAINGUARD_REPLICA": "worker-1",
        "TRAINGUARD_RESTART_COUNT": "2",
        "PYTHONUNBUFFERED": "1",
        "TRAINGUARD_SDK": "on",
        "W": "1",
    }
    assert env == expected


def test_replica_env_user_env_wins() -> None:
    spec = validate_spec(
        {
            "name": "job",
            "worker_pools": [
                {
                    "command": ["x"],
                    "env": {"MASTER_PORT": "1234", "PYTHONUNBUFFERED": "0", "SDK": "user"},
                }
            ],
        }
    )
    (plan,) = plan_replicas(spec)
    env = replica_env(
        plan,
        job_id="j",
        world_size=1,
        master_addr="localhost",
        master_port=29500,
        restart_count=0,
        max_restarts="unlimited",
        role_world_size=1,
        sdk_env={"SDK": "sdk", "MASTER_ADDR": "10.0.0.1"},
    )
    assert env["MASTER_PORT"] == "1234"  # the user's env beats ours
    assert env["PYTHONUNBUFFERED"] == "0"
    assert env["SDK"] == "user"  # and the SDK's
    assert env["MASTER_ADDR"] == "10.0.0.1"  # the SDK's env beats ours
    assert env["TORCHELASTIC_MAX_RESTARTS"] == "unlimited"
    assert env["RANK"] == "0"
    assert env["TRAINGUARD_REPLICA"] == "worker-0"


def test_problem_line_keeps_env_keys_starting_with_int() -> None:
    data = {"name": "job", "worker_pools": [{"command": ["x"], "env": {"interval": 5}}]}
    assert _problems(data) == [
        "worker_pools[0].env.interval: input should be a valid string, got 5"
    ]
