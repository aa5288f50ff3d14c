"""Public training scripts nobody here wrote, unmodified, under `trainguard run` (issue 41).

Each runs by the torchrun line tests/third_party/SOURCES.md records for it, with the word
`torchrun` changed to `trainguard run` and nothing else but `--plain` (output is a pipe
here). The scripts are vendored byte for byte; the first check holds each file to the
SHA-256 that SOURCES.md records, so "unmodified" is tested too."""

from __future__ import annotations

import hashlib
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TG

pytest.importorskip("torch")  # the torch extra; a base install skips this file

THIRD_PARTY = ROOT / "tests" / "third_party"
SOURCES = THIRD_PARTY / "SOURCES.md"
TIMEOUT = 180.0  # a busy 2-core machine running 4 test workers; each takes seconds alone


@dataclass(frozen=True)
class Script:
    folder: str  # under tests/third_party
    files: tuple[str, ...]  # the vendored code, each with its SHA-256 in SOURCES.md
    torchrun: str  # the line SOURCES.md records: [VAR=value ...] torchrun [options] script ...


AWS = Script("aws_cpu_ddp", ("ddp.py",), "torchrun --nproc_per_node=2 ddp.py 3 1")
LIGHTNING = Script(
    "lightning_bug_report",
    ("bug_report_model.py",),
    "PL_TRAINER_ACCELERATOR=cpu PL_TRAINER_DEVICES=2 PL_TRAINER_STRATEGY=ddp "
    "torchrun --nproc-per-node 2 bug_report_model.py",
)
PPO = Script(
    "lightning_ppo",
    ("train_torch.py", "rl/__init__.py", "rl/agent.py", "rl/loss.py", "rl/utils.py"),
    "torchrun --nproc_per_node=2 --standalone train_torch.py --total-timesteps 8192",
)
SCRIPTS = (AWS, LIGHTNING, PPO)


def _recorded_sha256() -> dict[str, str]:
    """SOURCES.md's `| `folder/file` | `sha256` |` rows."""
    rows = re.findall(r"^\| `([\w./-]+)` \| `([0-9a-f]{64})` \|$", SOURCES.read_text(), re.M)
    return dict(rows)


@pytest.mark.parametrize(
    "path", [f"{s.folder}/{name}" for s in SCRIPTS for name in s.files], ids=str
)
def test_vendored_file_is_byte_identical_to_its_source(path: str) -> None:
    recorded = _recorded_sha256()
    assert path in recorded, f"SOURCES.md records no SHA-256 for {path}"
    assert hashlib.sha256((THIRD_PARTY / path).read_bytes()).hexdigest() == recorded[path]


def test_sources_record_every_vendored_file_and_line() -> None:
    code = {str(p.relative_to(THIRD_PARTY)) for p in THIRD_PARTY.rglob("*.py")}
    assert code == set(_recorded_sha256())
    text = SOURCES.read_text()
    for script in SCRIPTS:
        assert f"`{script.torchrun}`" in text, script.torchrun
        assert (THIRD_PARTY / script.folder / "LICENSE").is_file()


def _trainguard_run(tg: TG, script: Script, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Run `script` by its torchrun line, `torchrun` changed to `trainguard run`, in a copy
    of its folder (it writes checkpoints and logs where it runs); its job's status."""
    cwd = tmp_path / script.folder
    shutil.copytree(THIRD_PARTY / script.folder, cwd)
    words = shlex.split(script.torchrun)
    env = dict(tg.env)
    while "=" in words[0]:  # the line's own environment, as a shell would pass it
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[0] == "torchrun", script.torchrun
    argv = tg.argv("run", "--plain", *words[1:])
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    job: dict[str, Any] = tg.only_job()
    assert job["state"] == "SUCCEEDED", job
    assert (job["attempts"], job["restarts"]) == (1, 0), job
    records = tg("records", job["id"])
    assert records.returncode == 0, records.stderr
    assert "SUCCEEDED" in records.stdout, records.stdout
    return cwd, job


def _logs(job: dict[str, Any]) -> dict[int, str]:
    """Each rank's log, as trainguard kept it."""
    return {int(r["rank"]): Path(r["log_path"]).read_text() for r in job["replicas"]}


def _primary_exited_0(job: dict[str, Any]) -> None:
    rank0 = next(r for r in job["replicas"] if r["rank"] == 0)
    assert (rank0["state"], rank0["exit_code"]) == ("SUCCEEDED", 0), rank0


@pytest.mark.slow
def test_aws_cpu_ddp(tg: TG, tmp_path: Path) -> None:
    """aws-samples' CPU DDP test case: 3 epochs of 32 steps on each of the 2 ranks."""
    cwd, job = _trainguard_run(tg, AWS, tmp_path)
    _primary_exited_0(job)
    logs = _logs(job)
    for rank in (0, 1):
        for epoch in range(3):  # printed as an epoch starts: rank 0 ends only after all
            line = f"[RANK {rank}] Epoch {epoch} | Batchsize: 32 | Steps: 32"
            assert line in logs[rank], (rank, logs[rank])
    # Rank 1 saves the same file after its last epoch too, but the job ends when rank 0
    # exits 0 and rank 1 may be stopped by then: only rank 0's save is certain.
    assert "Epoch 2 | Training snapshot saved at ./snapshot.pt" in logs[0], logs[0]
    assert (cwd / "snapshot.pt").is_file()


@pytest.mark.slow
def test_lightning_bug_report_model(tg: TG, tmp_path: Path) -> None:
    """Lightning's bug-report template, made a 2-process DDP job by PL_TRAINER_* alone."""
    cwd, job = _trainguard_run(tg, LIGHTNING, tmp_path)
    _primary_exited_0(job)
    logs = _logs(job)
    # each rank prints its own line as it joins the process group
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2" in logs[0], logs[0]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in logs[1], logs[1]
    assert "distributed_backend=gloo" in logs[0], logs[0]
    assert "All distributed processes registered. Starting with 2 processes" in logs[0]
    assert "`Trainer.fit` stopped: `max_epochs=1` reached." in logs[0], logs[0]
    # the one optimizer step, which DDP cannot take without rank 1, checkpointed by rank 0
    version = cwd / "lightning_logs" / "version_0"
    assert (version / "checkpoints" / "epoch=0-step=1.ckpt").is_file()
    # Lightning's default logger: TensorBoard's events where tensorboard is installed (the
    # test extra has it, for the PPO example), else a CSV file
    logged = b"".join(p.read_bytes() for p in version.glob("*") if p.is_file())
    assert b"test_loss" in logged, sorted(p.name for p in version.iterdir())


@pytest.mark.slow
def test_lightning_ppo_in_plain_pytorch(tg: TG, tmp_path: Path) -> None:
    """Lightning's PPO example in plain PyTorch: rank 0's TensorBoard log holds every
    update's scalars and the final test's reward, which it writes into a SummaryWriter it
    never closes (so they reach the disk only as the process ends)."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("tensorboard")
    cwd, job = _trainguard_run(tg, PPO, tmp_path)
    _primary_exited_0(job)
    (events,) = cwd.glob("logs/torch_logs/*/*/events.out.tfevents.*")
    data = events.read_bytes()
    updates = 8192 // (2 * 128 * 2)  # timesteps / (envs x steps x ranks): the defaults
    assert data.count(b"Info/learning_rate") == updates, data.count(b"Info/learning_rate")
    assert data.count(b"Test/cumulative_reward") == 1  # written last, flushed at the end
