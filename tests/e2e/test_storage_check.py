"""Checkpoints in an S3 bucket of a real S3-compatible server (moto's, as a process of its
own on loopback), and the storage check a host makes against it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import needs, wait_for

from trainguard.backends.net import free_port
from trainguard.backends.storage_check import storage_problem
from trainguard.storage import checkpoints
from trainguard.storage.env import ENV_CHECKPOINT_DIR, ENV_STORAGE_CHECK

MISSING = None
for module in ("moto", "s3fs", "fsspec"):
    if importlib.util.find_spec(module) is None:
        MISSING = f"{module} is not installed (pip install 'moto[server]' s3fs)"
pytestmark = [pytest.mark.slow, needs(MISSING, "S3 storage tests")]  # a real S3 server
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    saved = dict(os.environ)
    os.environ.update(CREDENTIALS, AWS_ENDPOINT_URL=url)
    try:
        import fsspec  # type: ignore[import-untyped]

        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        wait_for(lambda: _made(fs), 30, "moto's server")
        yield url
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.kill()
        server.wait()


def _made(fs: object) -> bool:
    try:
        fs.mkdir("tg-bucket")  # type: ignore[attr-defined]
    except FileExistsError:
        return True
    except Exception:
        return False
    return True


def test_checkpoints_commit_and_come_back_from_a_bucket(endpoint: str) -> None:
    src = Path(tempfile.mkdtemp())
    (src / "model.pt").write_bytes(b"weights of step 7")
    storage = "s3://tg-bucket/job-a"
    name = checkpoints.commit(src, storage, step=7)
    latest = checkpoints.latest(storage)
    assert latest is not None and latest.name == name
    assert (latest / "model.pt").read_bytes() == b"weights of step 7"
    assert checkpoints.verify(storage, name)


def test_a_host_checks_the_bucket_with_the_jobs_credentials(endpoint: str) -> None:
    storage = "s3://tg-bucket/job-b"
    checkpoints.write_marker(storage, "tg-marker")
    env = {**os.environ, ENV_CHECKPOINT_DIR: storage, ENV_STORAGE_CHECK: "tg-marker"}
    assert storage_problem(env) is None
    assert "another job's marker" in (storage_problem({**env, ENV_STORAGE_CHECK: "tg-x"}) or "")
    elsewhere = {**env, ENV_CHECKPOINT_DIR: "s3://tg-bucket/job-never-marked"}
    assert "is not there" in (storage_problem(elsewhere) or "")
    # The job's credentials, not this process's: without them the check fails, and says so.
    bare = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    bare["AWS_ENDPOINT_URL"] = endpoint
    said = storage_problem(bare) or ""
    assert "does not see the checkpoint storage s3://tg-bucket/job-b" in said
    assert "Credentials" in said, said
