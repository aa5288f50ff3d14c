"""Table tests for how the CLI builds a job spec (flags, a file, --ft-args) and for the one
field table those flags come from."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli.parser import build_parser, split_command
from trainguard.cli.spec_flags import build_spec
from trainguard.errors import SpecError
from trainguard.spec import fields
from trainguard.spec.aimaster_flags import FLAGS
from trainguard.spec.models import (
    ExecutionMode,
    FaultTolerance,
    FaultTolerantPolicy,
    JobSpec,
    SuccessPolicy,
)

# ---------------------------------------------------------------- build_spec


def _build(*argv: str) -> JobSpec:
    """What `trainguard run ARGV` builds (as cli.main splits and parses it)."""
    head, command = split_command(["run", *argv])
    args = build_parser().parse_args(head)
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
    args = build_parser().parse_args(["run", "--nproc", "3", "--", "python", "x.py", "--lr", "1"])
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


def test_an_unknown_framework_is_the_only_problem_named() -> None:
    assert _build_problems("--framework", "nope", "--nproc", "2", "--", "python", "x.py") == [
        "framework: must be one of 'pytorch', 'tensorflow', 'mpi', 'batch', 'torchft' or "
        "'generic', got 'nope' (from --framework)"
    ]


def test_mpi_from_the_command_line_gets_a_launcher_and_its_ranks() -> None:
    spec = _build("--framework", "mpi", "--nproc", "3", "--", "python", "x.py")
    pools = [(p.role, p.replicas, p.command) for p in spec.worker_pools]
    assert pools == [("launcher", 1, ["mpirun"]), ("worker", 3, ["python", "x.py"])]


def test_warm_start_is_on_by_default_and_flags_add_to_it_or_turn_it_off(tmp_path: Path) -> None:
    cmd = ("--", "python", "t.py")
    assert _build(*cmd).preload == ["auto"]
    assert _build("--preload", "transformers,json", *cmd).preload == [
        "auto",
        "transformers",
        "json",
    ]
    assert _build("--no-preload", *cmd).preload == []
    assert _build("--preload", "none", *cmd).preload == []
    assert _build_problems("--preload", "json", "--no-preload", *cmd) == [
        "--preload and --no-preload: give one of them"
    ]
    off = _write_spec(
        tmp_path, "name: j\npreload: none\nworker_pools: [{command: [python, t.py]}]\n"
    )
    assert _build("-f", off).preload == []
    assert _build("-f", off, "--preload", "json").preload == ["json"]
    named = _write_spec(
        tmp_path, "name: j\npreload: [torch]\nworker_pools: [{command: [python, t.py]}]\n"
    )
    assert _build("-f", named).preload == ["torch"]  # a spec's list is what it says
    mixed = _write_spec(
        tmp_path, "name: j\npreload: [none, json]\nworker_pools: [{command: [x]}]\n"
    )
    (problem,) = _build_problems("-f", mixed)
    assert problem.startswith("preload: ") and "cannot be listed with modules" in problem


def test_internal_commands_are_never_shown(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    shown = parser.format_help()
    assert "_master" not in shown and "run a job and supervise it" in shown
    with pytest.raises(SystemExit):
        parser.parse_args(["nosuch"])
    said = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in said and "'run'" in said and "_master" not in said
    assert parser.parse_args(["_master", "job-1"]).cmd == "_master"  # still there to run


# ---------------------------------------------------------------- the one field table


def _model_field(path: str) -> object:
    """The model field at a spec path (`fault_tolerance.job_hang_interval_s`), or None."""
    model: Any = JobSpec
    field = None
    for part in path.split("."):
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        model = getattr(field.annotation, "model_fields", None) and field.annotation
    return field


def test_every_row_of_the_field_table_is_a_spec_field_and_a_flag_of_run_and_submit() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("run", "submit"):
        actions = {a.dest: a for a in sub.choices[command]._actions}
        for row in fields.FIELDS:
            if row.flags:
                assert row.key in actions, (command, row)
                assert tuple(actions[row.key].option_strings) == row.flags
    refused = {"fault_tolerance.enable_c4d_hang_detection"}  # models.FaultTolerance._no_c4d
    for row in fields.FIELDS:
        if row.path and row.path not in refused:
            assert _model_field(row.path) is not None, row.path
    assert {r.path for r in fields.AIMASTER.values()} - refused <= {
        f"fault_tolerance.{f}" for f in FaultTolerance.model_fields
    }
    assert FLAGS["job-hang-interval"] == "job_hang_interval_s"


def test_a_flag_beats_a_spec_files_older_spelling(tmp_path: Path) -> None:
    path = _write_spec(
        tmp_path,
        "name: j\nworker_pools: [{command: [python, t.py]}]\n"
        "fault_tolerance: {job_hang_interval: 60, job_exit_hang_interval: 70}\n",
    )
    ft = _build("-f", path).fault_tolerance
    assert (ft.job_hang_interval_s, ft.job_exit_hang_interval_s) == (60, 70)
    ft = _build("-f", path, "--job-hang-interval", "30").fault_tolerance
    assert (ft.job_hang_interval_s, ft.job_exit_hang_interval_s) == (30, 70)
    ft = _build("-f", path, "--ft-args", "--job-exit-hang-interval=10").fault_tolerance
    assert (ft.job_hang_interval_s, ft.job_exit_hang_interval_s) == (60, 10)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (
            ("--ft-args", "--job-hang-interval=0"),
            "fault_tolerance.job_hang_interval_s: must be >= 0.5, got '0' "
            "(from --ft-args --job-hang-interval)",
        ),
        (
            ("--ft-args", "--job-hang-interval=0", "--job-hang-interval", "0.1"),
            "fault_tolerance.job_hang_interval_s: must be >= 0.5, got '0.1' "
            "(from --job-hang-interval)",
        ),
        (
            ("--gpus", "0,0"),
            "gpu_inventory: GPU 0 is listed twice: each GPU is handed out once (from --gpus)",
        ),
    ],
)
def test_a_problem_names_the_flag_that_set_the_value(argv: tuple[str, ...], problem: str) -> None:
    assert _build_problems(*argv, "--", "python", "x.py") == [problem]


def test_c4d_from_ft_args_is_refused_on_and_accepted_off() -> None:
    (line,) = _build_problems("--ft-args", "--enable-c4d-hang-detection=True", "--", "x")
    assert line.startswith("fault_tolerance.enable_c4d_hang_detection: C4D is Alibaba Cloud's")
    assert line.endswith("(from --ft-args --enable-c4d-hang-detection)")
    spec = _build("--ft-args", "--enable-c4d-hang-detection=False", "--", "x")
    assert spec.fault_tolerance == _build("--", "x").fault_tolerance


def test_node_agents_are_the_default_and_a_flag_turns_them_off(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: j\nslurm: {agents: false}\nworker_pools: [{command: [python, x.py]}]\n")
    assert _build("--", "python", "x.py").slurm.agents
    assert not _build("--no-node-agents", "--", "python", "x.py").slurm.agents
    assert not _build("-f", str(job)).slurm.agents
    assert _build("--node-agents", "-f", str(job)).slurm.agents  # the flag beats the file
    assert _build_problems("--node-agents", "--no-node-agents", "--", "python", "x.py") == [
        "--node-agents and --no-node-agents: give one of them"
    ]


def test_on_ray_the_agents_flags_set_rays_agents() -> None:
    ray = ("--backend", "ray", "--", "python", "x.py")
    assert _build(*ray).ray.agents
    off = _build("--no-node-agents", *ray)
    assert not off.ray.agents and off.slurm.agents  # Slurm's own is untouched
    assert _build("--node-agents", *ray).ray.agents
    assert _build("--no-node-agents", "--", "python", "x.py").slurm.agents is False
