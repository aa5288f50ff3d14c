"""torchrun's command line with one word changed (issue 41): what `trainguard run` makes
of `train.py ARGS`, `-m MODULE ARGS`, `--no-python`, torchrun's own flag spellings, and
its rendezvous flags, which trainguard refuses in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.cli.main import main
from trainguard.cli.parser import build_parser, split_command
from trainguard.cli.spec_flags import build_spec
from trainguard.cli.torchrun_flags import program
from trainguard.errors import SpecError
from trainguard.spec.models import JobSpec


def _build(*argv: str) -> JobSpec:
    """What `trainguard run ARGV` builds (as cli.main splits and parses it)."""
    head, command = split_command(["run", *argv])
    args = build_parser().parse_args(head)
    return build_spec(args, program(args, command or [c for c in args.command if c != "--"]))


def _command(*argv: str) -> list[str]:
    (pool,) = _build(*argv).worker_pools
    return list(pool.command)


def test_a_python_file_runs_with_this_interpreter_as_torchrun_runs_it() -> None:
    assert _command("train.py", "--lr", "0.1") == [sys.executable, "train.py", "--lr", "0.1"]
    assert _command("--", "train.py", "--lr", "0.1")[:2] == [sys.executable, "train.py"]
    assert _build("train.py").name == "train"


def test_a_module_runs_with_python_dash_m() -> None:
    assert _command("-m", "pkg.train", "--x", "1") == [
        sys.executable,
        "-m",
        "pkg.train",
        "--x",
        "1",
    ]


def test_no_python_and_any_other_program_run_as_given() -> None:
    assert _command("--no-python", "train.py") == ["train.py"]
    assert _command("--no_python", "./run.sh", "a") == ["./run.sh", "a"]
    assert _command("--", "python", "x.py") == ["python", "x.py"]  # as before
    assert _command("bash", "x.sh") == ["bash", "x.sh"]


def test_torchruns_spellings_of_the_same_flags_are_accepted() -> None:
    spec = _build("--nproc_per_node", "3", "--standalone", "train.py")
    assert spec.worker_pools[0].replicas == 3
    assert _build("--max-restarts", "2", "train.py").fault_tolerance.max_num_of_job_restart == 2
    assert _build("--max_restarts", "2", "train.py").fault_tolerance.max_num_of_job_restart == 2


def test_nnodes_is_the_number_of_nodes_trainguard_places() -> None:
    spec = _build("--nnodes", "1", "--nproc_per_node", "2", "train.py")
    assert spec.worker_pools[0].replicas == 2
    assert spec.slurm.nodes == 1
    assert _build("--backend", "slurm", "--nnodes", "2", "--nodes", "2", "x.py").slurm.nodes == 2


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--rdzv-endpoint", "h:29500", "train.py"), "--rdzv-endpoint: trainguard holds the"),
        (("--rdzv_backend", "c10d", "train.py"), "--rdzv-backend: trainguard holds the"),
        (("-m", "--no-python", "pkg.train"), "-m and --no-python: give one of them"),
        (("-m",), "-m: name the module to run"),
        (("--master_addr", "h", "train.py"), "--master-addr: trainguard holds the"),
        (("--master-port", "29500", "train.py"), "--master-port: trainguard holds the"),
        (("--node_rank", "0", "train.py"), "--node-rank: trainguard starts the ranks of every"),
        (("--nnodes", "1:4", "train.py"), "--nnodes 1:4: torchrun's elastic MIN:MAX"),
        (("--nnodes", "two", "train.py"), "--nnodes: must be a whole number of nodes"),
        (("--nnodes", "2", "--nodes", "3", "train.py"), "--nnodes 2 and --nodes 3: give one"),
    ],
)
def test_what_trainguard_refuses_is_one_line_that_names_it(
    argv: tuple[str, ...], problem: str
) -> None:
    with pytest.raises(SpecError) as info:
        _build(*argv)
    (line,) = info.value.problems
    assert line.startswith(problem), line


def test_a_refused_flag_exits_2_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--rdzv-id", "7", "train.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainguard: --rdzv-id: trainguard holds the rendezvous")
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_script_runs_with_torchruns_words(tmp_path: Path) -> None:
    """For real: `trainguard run --nproc_per_node 2 train.py --lr 0.1` (no `python`, no
    `--`) runs the script with this interpreter, in torchrun's environment."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys\n"
        "print('ran', os.environ['RANK'], os.environ['WORLD_SIZE'], sys.argv[1:],"
        " sys.executable == os.environ['EXPECT'], flush=True)\n"
    )
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "TRAINGUARD_HOME": str(tmp_path / "home"),
        "EXPECT": sys.executable,
    }
    # `all`: under the default (R-JOB-4) rank 0's exit 0 ends the job, and stops a rank 1
    # a busy machine has not run yet (seen in CI)
    argv = [sys.executable, "-m", "trainguard", "run", "--plain", "--success-policy", "all"]
    argv += ["--nproc_per_node", "2"]
    res = subprocess.run(
        [*argv, str(script), "--lr", "0.1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    for rank in ("0", "1"):
        assert f"ran {rank} 2 ['--lr', '0.1'] True" in res.stdout, res.stdout
