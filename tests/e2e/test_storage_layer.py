"""What a training process loads (issue 39): the SDK's checkpoint path imports the SDK and
`trainguard.storage`, nothing of the master, the backends or the policy; and the server mints
its job ids without the master."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from trainguard.storage import env
from trainguard.storage.ids import new_job_id

SRC = ROOT / "src" / "trainguard"
NEVER_IN_TRAINING = ("backends", "policy", "classify", "master", "records", "service", "hangs")

# Every call a training script makes to save, find and load its checkpoints and snapshots.
CHECKPOINT_PATH = """
import json, os, sys
from pathlib import Path
import trainguard.sdk as sdk
import trainguard.train
folder = Path(sys.argv[1]) / "ckpt"
folder.mkdir()
(folder / "weights.bin").write_bytes(b"w" * 100)
sdk.report({"step": 3}, checkpoint=str(folder))
sdk.snapshot({"step": 4}, 4)
found = sdk.get_checkpoint()
loaded = sdk.load_snapshot()
sdk.mark_checkpoint_bad(str(Path(found).parent / "checkpoint_000001"))
print(json.dumps({
    "found": found,
    "loaded": list(loaded) if loaded else None,
    "modules": sorted(m for m in sys.modules if m.startswith("trainguard")),
}))
"""


@pytest.mark.slow  # starts a real interpreter: a fresh sys.modules is the point
def test_the_sdk_checkpoint_path_loads_no_master_backend_or_policy(tmp_path: Path) -> None:
    run_env = {
        **os.environ,
        env.ENV_CHECKPOINT_DIR: str(tmp_path / "storage"),
        env.ENV_SNAPSHOT_DIR: str(tmp_path / "shm"),
        env.ENV_SNAPSHOT_PERSIST_EVERY: "0",
        "PYTHONWARNINGS": "ignore",  # outside a master: the SDK's one warning
    }
    for name in (env.ENV_MASTER_URL, env.ENV_TOKEN, env.ENV_REPLICA):
        run_env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", CHECKPOINT_PATH, str(tmp_path)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["found"].endswith("step_000000000004")  # the snapshot: newer than step 3
    assert got["loaded"] == [4, {"step": 4}]
    modules = got["modules"]
    assert "trainguard.storage.checkpoints" in modules  # the path was taken
    assert "trainguard.storage.snapshots" in modules
    loaded = sorted({m.split(".")[1] for m in modules if m.count(".") >= 1})
    assert [p for p in loaded if p in NEVER_IN_TRAINING] == [], modules
    assert set(loaded) <= {"sdk", "storage", "train"}, modules


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_the_server_does_not_import_the_master() -> None:
    """The server starts masters as processes; it mints job ids and tokens with storage.ids."""
    wrong = [
        f"{path.relative_to(SRC)}: {name}"
        for path in sorted((SRC / "service").rglob("*.py"))
        for name in _imports(path)
        if name == "trainguard.master" or name.startswith("trainguard.master.")
    ]
    assert wrong == []


def test_a_job_id_says_its_day_and_is_fresh() -> None:
    ids = {new_job_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"tg-\d{8}-[0-9a-f]{6}", i) for i in ids), sorted(ids)[:3]


def test_the_sdk_and_the_backends_spell_the_variables_as_storage_does() -> None:
    """One spelling: the SDK re-exports storage.env's names; the Slurm node probe, which runs
    by path with no package imported, repeats one and must agree."""
    from trainguard import sdk
    from trainguard.backends.slurm import node_probe

    assert sdk.ENV_CHECKPOINT_DIR is env.ENV_CHECKPOINT_DIR
    assert sdk.ENV_FAULTHANDLER_FILE is env.ENV_FAULTHANDLER_FILE
    assert node_probe._CHECKPOINT_ENV == env.ENV_CHECKPOINT_DIR
    names = [v for k, v in vars(env).items() if k.startswith("ENV_")]
    assert len(set(names)) == len(names) and all(n.startswith("TRAINGUARD_") for n in names)
