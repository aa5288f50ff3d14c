"""The same refusals through the real CLI process (issue 37): the bytes as a shell passes
them, exit status 2, one line on stderr, no traceback, nothing in the home."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TG

pytestmark = pytest.mark.slow  # every test here runs the real CLI

BYTE_FF = "\udcff"  # subprocess passes it on as the byte 0xff, as `$'\xff'` in a shell
# A regression that reads /dev/zero whole ends in a MemoryError, not in the OOM killer.
BOUNDED = ["timeout", "120", "prlimit", "--as=1073741824", "--"]


def _refused(tg: TG, *args: str) -> str:
    res = tg(*args)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("trainguard"), res.stderr
    assert not tg.home.exists(), sorted(tg.home.rglob("*"))  # no store, no job, no folder
    return res.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("run", "--", "python", "-c", BYTE_FF), "worker_pools[0].command[2]:"),
        (("run", "--env", f"A={BYTE_FF}", "--", "true"), "not UTF-8 text"),
        (("run", "--retryable-error", f"{BYTE_FF}(", "--", "true"), "(from --retryable-error)"),
        (("run", "--retryable-error", "e" * 100_000, "--", "true"), "at most 1000 characters"),
        (("run", "--nodes", "2", "--", "true"), "slurm.nodes: 2 nodes need the slurm backend"),
        (("status", BYTE_FF), "job: '\\udcff' holds the byte 0xff"),
        (("classify", "/dev/zero"), "/dev/zero: cannot read the log (a device, not a log file)"),
        (("classify", "/etc/hostname", "--exit-code", "99999999999999"), "from 0 to 255"),
        (("classify", "/etc/hostname", "--exit-code", "-3"), "from 0 to 255"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    tg = TG(tmp_path / "home", prefix=BOUNDED)
    assert said in _refused(tg, *args)


def test_a_spec_file_with_replicas_true_is_refused(tg: TG, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\nworker_pools:\n  - command: [python, t.py]\n    replicas: true\n")
    said = _refused(tg, "run", "-f", str(spec))
    assert said == "trainguard: worker_pools[0].replicas: must be a number, got true\n"
