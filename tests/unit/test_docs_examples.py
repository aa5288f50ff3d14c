"""Every example in the docs holds (issue 41): each YAML job spec validates against the
models, each `trainguard ...` command line parses with the real parser, the cheap ones run,
and each Python block that needs no cluster runs. A block opts out with `# fragment` (YAML)
or `# needs: WHAT` (Python) on its first line, saying why."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from trainguard.cli.main import main
from trainguard.cli.parser import build_parser, command_of, split_command
from trainguard.spec.models import validate_spec

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_FENCE = re.compile(
    r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
CHEAP = frozenset({"validate", "completion"})
"""Commands that run in a moment and touch no store: the docs' lines of them are run."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in _FENCE.finditer(text):
            body = "\n".join(ln[len(m["indent"]) :] for ln in m["body"].splitlines())
            line = text.count("\n", 0, m.start()) + 1
            out.append(Block(str(page.relative_to(ROOT)), line, m["lang"], body))
    return out


BLOCKS = _blocks()


def _specs() -> list[tuple[Block, object]]:
    """The job specs of YAML blocks (a block may hold several documents), not fragments
    or other files (a server's config)."""
    out: list[tuple[Block, object]] = []
    for b in BLOCKS:
        if b.lang not in ("yaml", "yml") or b.body.lstrip().startswith("# fragment"):
            continue
        for data in yaml.safe_load_all(b.body):
            if isinstance(data, dict) and "worker_pools" in data:
                out.append((b, data))
    return out


def _command_lines() -> list[tuple[Block, list[str]]]:
    """`trainguard ...` lines of shell blocks (a `$ ` prompt taken off, `\\` joined,
    comments dropped), as argv without the program's name."""
    out = []
    for b in BLOCKS:
        if b.lang not in ("bash", "console", "sh", "shell"):
            continue
        for line in b.body.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if not line.startswith("trainguard "):
                continue
            argv = shlex.split(line, comments=True)[1:]
            if any(a.startswith(("<", "$(")) for a in argv) or "|" in argv:
                continue
            out.append((b, argv))
    return out


def _pythons() -> list[Block]:
    return [b for b in BLOCKS if b.lang in ("python", "py") and "# needs:" not in b.body[:200]]


def test_the_docs_have_examples_of_each_kind() -> None:
    """The checks below check something: the pages hold specs and command lines."""
    assert len(_specs()) >= 3
    assert len(_command_lines()) >= 20


@pytest.mark.parametrize(
    ("block", "data"), _specs(), ids=lambda x: str(x) if isinstance(x, Block) else ""
)
def test_every_job_spec_in_the_docs_validates(block: Block, data: object) -> None:
    validate_spec(data)


@pytest.mark.parametrize(
    ("block", "argv"),
    _command_lines(),
    ids=lambda x: str(x) if isinstance(x, Block) else " ".join(x)[:60],
)
def test_every_command_line_in_the_docs_parses(block: Block, argv: list[str]) -> None:
    head, _ = split_command(argv)
    try:
        build_parser(command_of(head)).parse_args(head)
    except SystemExit as exc:  # argparse's way of refusing a line
        pytest.fail(f"{block}: `trainguard {' '.join(argv)}` does not parse ({exc.code})")


@pytest.mark.parametrize(
    ("block", "argv"),
    [(b, a) for b, a in _command_lines() if a and a[0] in CHEAP and "-f" not in a],
    ids=lambda x: str(x) if isinstance(x, Block) else " ".join(x)[:60],
)
def test_the_cheap_command_lines_in_the_docs_run(
    block: Block, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0, f"{block}: trainguard {' '.join(argv)}"


@pytest.mark.filterwarnings("ignore::trainguard.sdk.SdkWarning")  # no master here: calls do nothing
@pytest.mark.parametrize("block", _pythons(), ids=str)
def test_every_python_block_that_needs_no_cluster_runs(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block.body, str(block), "exec"), {"__name__": "docs_example"})
