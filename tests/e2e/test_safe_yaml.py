"""User YAML is read with bounds: each bad file gets one line, nothing is built first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import TG

from trainguard.errors import SpecError
from trainguard.spec.models import load_spec_file, validate_spec
from trainguard.spec.safe_yaml import YamlProblem, parse_bounded

BOMB = """
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (BOMB, "more than 32 aliases at line 6 (an alias bomb?)"),
        ("name: a\nname: b\n", "the key 'name' is given twice at line 2"),
        ("a:\n  x: 1\n  x: 2\n", "the key 'x' is given twice at line 3"),
        ("[" * 100 + "]" * 100, "nested more than 64 levels deep at line 1"),
        ("name: [unclosed\n", "not valid YAML at line 2"),
        ("name: a\x00b\n", "it holds NUL bytes: a binary file, not YAML"),
    ],
)
def test_bad_yaml_gets_one_line(text: str, problem: str) -> None:
    with pytest.raises(YamlProblem) as exc:
        parse_bounded(text)
    assert str(exc.value) == problem


def test_good_yaml_with_a_few_aliases_still_loads() -> None:
    text = "base: &env {A: '1'}\npools:\n  - env: *env\n  - env: *env\n"
    assert parse_bounded(text)["pools"][1]["env"] == {"A": "1"}


def _problem(path: Path) -> str:
    with pytest.raises(SpecError) as exc:
        load_spec_file(path)
    (line,) = exc.value.problems
    return line


def test_a_spec_file_that_is_not_a_spec_is_named(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("x: " + "y" * (1024 * 1024) + "\n")
    assert _problem(big) == f"{big}: larger than 1024 KiB"
    binary = tmp_path / "model.bin"
    binary.write_bytes(os.urandom(256) + b"\xff\xfe")
    assert _problem(binary) in (
        f"{binary}: not UTF-8 text: a binary file?",
        f"{binary}: it holds NUL bytes: a binary file, not YAML",
    )
    dup = tmp_path / "dup.yaml"
    dup.write_text("name: a\nname: b\n")
    assert _problem(dup) == f"{dup}: the key 'name' is given twice at line 2"


def test_dev_zero_is_read_with_a_cap() -> None:
    assert _problem(Path("/dev/zero")) == "/dev/zero: larger than 1024 KiB"


@pytest.mark.parametrize(
    ("pool", "problem"),
    [
        ({"command": ["python", "a\x00b"]}, "command[1]: holds a NUL byte"),
        ({"command": ["python"], "env": {"A=B": "1"}}, "env: 'A=B' is not a variable name"),
        ({"command": ["python"], "env": {"": "1"}}, "env: '' is not a variable name"),
        ({"command": ["python"], "env": {"A": "x\x00"}}, "env.A: holds a NUL byte"),
    ],
)
def test_what_cannot_start_is_a_spec_error(pool: dict[str, object], problem: str) -> None:
    with pytest.raises(SpecError) as exc:
        validate_spec({"worker_pools": [pool]})
    assert any(problem in p for p in exc.value.problems), exc.value.problems


@pytest.mark.slow
def test_a_bad_variable_name_in_a_spec_file_exits_2_naming_the_field(
    tg: TG, tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("worker_pools:\n  - command: [\"true\"]\n    env: {'A=B': '1'}\n")
    res = tg("run", "-f", str(spec))
    assert res.returncode == 2, res.stderr
    assert "worker_pools[0]" in res.stderr and "'A=B' is not a variable name" in res.stderr
    assert "Traceback" not in res.stderr
