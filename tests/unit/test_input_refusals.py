"""Bad input gets one line naming the field and the value, exit 2, nothing stored (issue
37): bytes that are not UTF-8, a yes/no where a count belongs, `--nodes` with the local
backend, unbounded retryable patterns, `classify` of a device or a huge exit status.

Fast tier: validation and the CLI's `main` in this process; nothing starts a process.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainguard.classify.catalogue import Rules, compile_user_pattern
from trainguard.classify.classes import ExitEvidence
from trainguard.classify.exits import classify_exit
from trainguard.cli.main import main
from trainguard.errors import SpecError
from trainguard.spec.bounded_read import read_tail
from trainguard.spec.limits import MAX_PATTERN_CHARS, MAX_PATTERNS
from trainguard.spec.models import validate_spec
from trainguard.spec.safe_yaml import YamlProblem, parse_bounded

BYTE_FF = "\udcff"  # how Python hands over the byte 0xff of argv, the environment, a path


def _problems(**fields: Any) -> list[str]:
    pool = fields.pop("pool", {})
    data = {"name": "j", "worker_pools": [{"command": ["python", "t.py"], **pool}], **fields}
    with pytest.raises(SpecError) as exc:
        validate_spec(data)
    return exc.value.problems


def _one(problems: list[str], field: str, *words: str) -> str:
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(f"{field}:"), line
    assert all(w in line for w in words), line
    assert len(line) < 240 and "\n" not in line, line
    return line


# ------------------------------------------------------------- not UTF-8 (lone surrogates)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"pool": {"command": ["python", "-c", BYTE_FF]}}, "worker_pools[0].command[2]"),
        ({"pool": {"command": ["python"], "env": {"A": "x" + BYTE_FF}}}, "worker_pools[0].env.A"),
        ({"pool": {"command": ["python"], "env": {BYTE_FF + "A": "1"}}}, "worker_pools[0].env"),
        (
            {"fault_tolerance": {"retryable_errors": ["ok", BYTE_FF + "("]}},
            "fault_tolerance.retryable_errors[1]",
        ),
        ({"name": "a" + BYTE_FF}, "name"),
        ({"progress": {"pattern": f"(?P<step>{BYTE_FF})"}}, "progress.pattern"),
        ({"checkpoint": {"storage": "/tmp/" + "\ud800"}}, "checkpoint.storage"),
    ],
)
def test_text_that_is_not_utf8_is_refused_by_field(fields: dict[str, Any], field: str) -> None:
    line = _one(_problems(**fields), field, "not UTF-8")
    assert "0xff" in line or "U+D800" in line


def test_a_runtime_pattern_that_is_not_utf8_cannot_crash_the_master() -> None:
    """The SDK's JSON may carry one: RE2 raised UnicodeEncodeError while building the
    rules, which ended the master. It now matches the byte as the log decodes it."""
    pattern = compile_user_pattern(f"flaky {BYTE_FF} disk")
    assert pattern.search(b"flaky \xff disk".decode("utf-8", "replace")) is not None
    rules = Rules.default(("ok",), (BYTE_FF + "(", "\ud800"))
    tail = ("RuntimeError: flaky \ufffd( gone",)
    c = classify_exit(ExitEvidence("w", 1, log_tail=tail), rules)
    assert (c.retryable, c.rule) == (True, "runtime-keyword-0")


def test_a_blank_runtime_pattern_does_not_make_every_failure_retryable() -> None:
    rules = Rules.default((), ("", "  ", "flaky"))
    assert [sig.id for sig in rules.user] == ["runtime-keyword-2"]
    c = classify_exit(ExitEvidence("w", 1, log_tail=("ValueError: a bug",)), rules)
    assert c.retryable is False


# ------------------------------------------------------------- a yes/no is not a number


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"pool": {"replicas": True}}, "worker_pools[0].replicas"),
        ({"pool": {"resources": {"gpus": True}}}, "worker_pools[0].resources.gpus"),
        ({"pool": {"resources": {"cpus": False}}}, "worker_pools[0].resources.cpus"),
        ({"pool": {"resources": {"custom": {"tpu": True}}}}, "worker_pools[0].resources.custom"),
        ({"gpu_inventory": [0, True]}, "gpu_inventory[1]"),
        ({"checkpoint": {"keep_last": True}}, "checkpoint.keep_last"),
        ({"queue": {"priority": True}}, "queue.priority"),
        ({"queue": {"max_wait": True}}, "queue.max_wait_s"),
        ({"fault_tolerance": {"stop_grace_period_s": True}}, "fault_tolerance.stop_grace"),
        ({"slurm": {"nodes": True}}, "slurm.nodes"),
        ({"torchft": {"nproc_per_group": True}}, "torchft.nproc_per_group"),
        ({"ray": {"node_timeout_s": True}}, "ray.node_timeout_s"),
        ({"notifications": [{"url": "http://h", "retries": True}]}, "notifications[0].retries"),
    ],
)
def test_a_bool_where_a_number_belongs_is_refused(fields: dict[str, Any], field: str) -> None:
    problems = _problems(**fields)
    assert len(problems) == 1 and problems[0].startswith(field), problems
    assert "must be a number, got" in problems[0], problems


def test_bools_stay_bools_and_numbers_stay_numbers() -> None:
    spec = validate_spec(
        {
            "name": "j",
            "worker_pools": [{"command": ["x"], "replicas": 2, "resources": {"cpus": 1}}],
            "fault_tolerance": {"enable_job_restart": False, "retry_uncertain": True},
            "queue": {"wait_for_capacity": True, "priority": 3},
            "slurm": {"drain_lost_nodes": True},
        }
    )
    assert spec.world_size == 2 and spec.fault_tolerance.enable_job_restart is False
    # the budgets' own converter keeps its fuller message for a bool
    problems = _problems(fault_tolerance={"max_num_of_job_restart": True})
    assert "or 'unlimited'" in problems[0], problems


# ------------------------------------------------------------- --nodes on the local backend


def test_several_nodes_need_the_slurm_backend() -> None:
    slurm = {"nodes": 2, "tasks_per_node": 1}
    line = _one(_problems(pool={"replicas": 2}, slurm=slurm), "slurm.nodes", "2 nodes", "local")
    assert "slurm backend" in line
    one = {"name": "j", "worker_pools": [{"command": ["x"]}], "slurm": {"nodes": 1}}
    assert validate_spec(one).slurm.nodes == 1  # one node is this machine
    on_slurm = {**one, "backend": "slurm", "slurm": slurm, "worker_pools": [POOL2]}
    assert validate_spec(on_slurm).slurm.nodes == 2


POOL2 = {"command": ["x"], "replicas": 2}


# ------------------------------------------------------------- retryable patterns, bounded


def test_retryable_patterns_are_bounded_in_length_count_and_blankness() -> None:
    long = "a" * (MAX_PATTERN_CHARS + 1)
    line = _one(
        _problems(fault_tolerance={"retryable_errors": ["ok", long]}),
        "fault_tolerance.retryable_errors[1]",
        f"at most {MAX_PATTERN_CHARS} characters",
        f"({MAX_PATTERN_CHARS + 1} characters)",
    )
    assert long not in line
    many = [f"e{i}" for i in range(MAX_PATTERNS + 1)]
    _one(
        _problems(fault_tolerance={"retryable_errors": many}),
        "fault_tolerance.retryable_errors",
        f"at most {MAX_PATTERNS} patterns, got {MAX_PATTERNS + 1}",
    )
    _one(
        _problems(fault_tolerance={"retryable_errors": [" "]}),
        "fault_tolerance.retryable_errors[0]",
        "blank",
    )
    most = [f"{i}" + "b" * (MAX_PATTERN_CHARS - 5) for i in range(MAX_PATTERNS)]
    ok = validate_spec(
        {
            "name": "j",
            "worker_pools": [{"command": ["x"]}],
            "fault_tolerance": {"retryable_errors": most},
        }
    )
    assert len(ok.fault_tolerance.retryable_errors) == MAX_PATTERNS


def test_a_huge_value_is_shown_cut_short_in_any_problem() -> None:
    problems = _problems(framework="x" * 100_000)
    assert len(problems) == 1 and len(problems[0]) < 400, problems[0][:500]


# ------------------------------------------------------------- found in the sweep


@pytest.mark.parametrize("address", ["\x01", "head", "head:0", "head:70000", "http://h:1", " auto"])
def test_a_ray_address_ray_init_refuses_is_refused_before_the_job(address: str) -> None:
    """It was stored, then failed in the master as an internal error, attempt after attempt."""
    line = _one(_problems(backend="ray", ray={"address": address}), "ray.address", "HOST:PORT")
    assert "got" in line


@pytest.mark.parametrize(
    "address", ["auto", "local", "10.0.0.5:6379", "[::1]:6379", "ray://head:10001", "ray://head"]
)
def test_every_address_ray_init_takes_is_taken(address: str) -> None:
    data = {"name": "j", "worker_pools": [{"command": ["x"]}], "backend": "ray"}
    assert validate_spec({**data, "ray": {"address": address}}).ray.address == address


def test_a_gpu_listed_twice_is_refused() -> None:
    _one(_problems(gpu_inventory=[0, 1, 0]), "gpu_inventory", "GPU 0 is listed twice")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("replicas: " + "9" * 5000, "Exceeds the limit (4300 digits)"),
        ("when: 2019-13-01", "month must be in 1..12"),
    ],
)
def test_a_yaml_value_its_constructor_refuses_is_one_line(text: str, why: str) -> None:
    with pytest.raises(YamlProblem) as exc:
        parse_bounded(text)
    assert str(exc.value).startswith(f"a value YAML cannot build: {why}"), exc.value
    assert len(str(exc.value)) < 200


# ------------------------------------------------------------- the tail of any file, bounded


def test_a_device_is_refused_not_read_forever() -> None:
    with pytest.raises(OSError) as exc:
        read_tail(Path("/dev/zero"), 1024)
    assert exc.value.strerror == "a device, not a log file"


def test_a_regular_file_is_read_from_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    with open(log, "wb") as fh:
        fh.write(b"x" * 5_000_000 + b"\nlast line\n")
    assert read_tail(log, 100) == (b"x" * 5_000_000 + b"\nlast line\n")[-100:]
    with pytest.raises(OSError) as exc:
        read_tail(tmp_path, 100)
    assert exc.value.strerror == "a folder, not a log file"


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@contextlib.contextmanager
def _writing(path: Path, data: bytes, times: int) -> Iterator[None]:
    """A thread writes `data` `times` times into the FIFO (it waits for the reader)."""

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), open(path, "wb") as fh:
            for _ in range(times):
                fh.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    yield
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_a_fifo_is_streamed_keeping_only_its_tail(fifo: Path) -> None:
    data = b"0123456789" * 1000
    with _writing(fifo, data, 100):  # 1 MB, then the end
        assert read_tail(fifo, 15) == data[-15:]


def test_a_stream_without_an_end_is_refused_past_the_cap(fifo: Path) -> None:
    with _writing(fifo, b"y" * 65536, 10**6), pytest.raises(OSError) as exc:  # 64 GB
        read_tail(fifo, 1024, cap=4 * 2**20)
    assert exc.value.strerror == "no end after 4 MiB: give the log file itself"


# ------------------------------------------------------------- the CLI's main, in this process


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINGUARD_HOME", str(home))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("TRAINGUARD_SERVER", raising=False)
    return home


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--", "python", "-c", BYTE_FF], "worker_pools[0].command[2]: '\\udcff' holds"),
        (["run", "--env", "A=" + BYTE_FF, "--", "true"], "(from --env)"),
        (["run", "--env", BYTE_FF + "=1", "--", "true"], "the key '\\udcff'"),
        (["run", "--retryable-error", BYTE_FF, "--", "true"], "(from --retryable-error)"),
        (["run", "--retryable-error", "e" * 100_000, "--", "true"], "(100000 characters)"),
        (["run", "--retryable-error", "", "--", "true"], "blank"),
        (["run", "--nodes", "2", "--", "true"], "(from --nodes)"),
        (["run", "--nodes", "9" * 5000, "--", "true"], "--nodes: must be 1 to 4096"),
        (["run", "--framework", "torchft", "--groups", "9" * 5000, "--", "x"], "--groups"),
        (["submit", "--env", BYTE_FF + "=1", "--", "true"], "(from --env)"),
        (["status", BYTE_FF], "job: '\\udcff' holds the byte 0xff"),
        (["logs", "j", "--replica", BYTE_FF], "--replica:"),
        (["jobs", "--server", "http://h" + BYTE_FF], "--server:"),
        (["server", "--host", BYTE_FF, "--port", "0"], "--host: '\\udcff' holds"),
        (["classify", "/x", "--exit-code", "99999999999999"], "must be from 0 to 255"),
        (["classify", "/x", "--exit-code", "-5"], "--signal N"),
        (["classify", "/x", "--exit-code", "9" * 5000], "must be from 0 to 255"),
        (["classify", "/x", "--exit-code", "1", "--signal", "9"], "not allowed with"),
        (["classify", "/x", "--retryable-error", "e" * 1001], "--retryable-error: at most 1000"),
    ],
)
def test_the_cli_says_one_line_exits_2_and_stores_nothing(
    home: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own refusal
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert said in err, err
    assert err.count("\n") == 1 and len(err) < 400, err[:600]
    assert "Traceback" not in err and out == ""
    assert not home.exists(), sorted(home.rglob("*"))


def test_a_spec_file_with_a_bool_count_is_refused(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\nworker_pools:\n  - command: [python, t.py]\n    replicas: true\n")
    assert main(["run", "-f", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err == "trainguard: worker_pools[0].replicas: must be a number, got true\n"
    assert not home.exists()


@pytest.mark.parametrize("shape", ["empty", "loop", "dangling"])
def test_a_from_checkpoint_folder_the_master_cannot_copy_is_refused(
    home: Path, tmp_path: Path, shape: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = tmp_path / "seed"
    seed.mkdir()
    if shape == "loop":
        (seed / "state.json").write_text("{}")
        (seed / "again").symlink_to(seed)
    elif shape == "dangling":
        (seed / "state.json").symlink_to(tmp_path / "gone")
    assert main(["run", "--from-checkpoint", str(seed), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainguard: --from-checkpoint: ") and err.count("\n") == 1, err
    assert {"empty": "holds no file", "loop": "links back", "dangling": "link to nothing"}[
        shape
    ] in err
    assert not home.exists()
