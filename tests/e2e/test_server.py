"""`trainguard server` for real: a server process, job masters, the CLI over HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import TG, alive, child, wait_for

from trainguard.states import JobState

pytestmark = pytest.mark.slow  # a real server process


class Server:
    """A running server on a free port, and the CLI pointed at it."""

    def __init__(self, tg: TG, *flags: str) -> None:
        self.tg = tg
        self.flags = flags
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.home_token: str | None = None
        self.token = flags[flags.index("--token") + 1] if "--token" in flags else None
        if "--token-file" in flags:
            self.token = Path(flags[flags.index("--token-file") + 1]).read_text().strip()

    def start(self) -> Server:
        info = self.tg.home / "server.json"
        info.unlink(missing_ok=True)
        self.proc = self.tg.start("server", "--port", "0", *self.flags)
        proc = self.proc
        wait_for(lambda: info.is_file() or proc.poll() is not None, 30, "the server")
        assert self.proc.poll() is None, self.proc.communicate()
        self.url = json.loads(info.read_text())["url"]
        made = self.tg.home / "server.token"  # no token given: the server made one
        self.home_token = made.read_text().strip() if made.is_file() else None
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def cli(self, *args: str, token: str | None = "") -> subprocess.CompletedProcess[str]:
        token = self.token if token == "" else token
        extra = ["--token", token] if token else []
        return self.tg(*args[:1], "--server", self.url, *extra, *args[1:])

    def json(self, *args: str) -> Any:
        res = self.cli(*args, "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def submit(self, *args: str) -> str:
        res = self.cli("submit", *args)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    def state(self, job_id: str) -> str:
        return str(self.json("status", job_id)["state"])

    def wait_state(self, job_id: str, *states: str, timeout: float = 60) -> str:
        return str(
            wait_for(
                lambda: (s := self.state(job_id)) in states and s,
                timeout,
                f"{job_id} to be {'/'.join(states)}",
            )
        )

    def http(self, method: str, path: str, body: Any = None, token: str | None = "") -> Any:
        """A request with `token` ("": the server's own, None: none)."""
        token = (self.token or self.home_token) if token == "" else token
        req = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())

    def stop(self) -> None:
        """Cancel what still runs (masters outlive the server), then stop the server."""
        if self.proc is not None and self.proc.poll() is None:
            for job in self.json("jobs", "--limit", "1000"):
                if not JobState(job["state"]).is_terminal:
                    self.cli("cancel", job["id"])
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for job in self.tg.json("jobs", "--limit", "1000"):
            if JobState(job["state"]).is_terminal:
                continue  # its master is gone: no second CLI process to ask for its pid
            pid = self.tg.json("status", job["id"])["master_pid"]
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def server_factory(tg: TG) -> Iterator[Any]:
    made: list[Server] = []

    def make(*flags: str) -> Server:
        s = Server(tg, *flags).start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def sleeper(seconds: float) -> list[str]:
    return ["--", *child("*:print:started {rank}", f"*:sleep:{seconds}", "*:print:done")]


def gated(gate: Path) -> list[str]:
    """A job that runs until the test creates `gate`: no race with a slow machine."""
    return ["--", *child("*:print:started {rank}", f"*:wait-file:{gate}", "*:print:done")]


def test_submit_runs_the_job_and_every_reader_works_over_http(server_factory: Any) -> None:
    srv = server_factory("--cpus", "4")
    job_id = srv.submit(
        "--nproc-per-node",
        "2",
        "--job-name",
        "flaky",
        "--",
        *child("1@0:sleep:0.3", "1@0:signal:SIGKILL", "0:sleep:1", "*:print:hello {rank}"),
    )
    assert srv.wait_state(job_id, "SUCCEEDED", "FAILED") == "SUCCEEDED"
    remote = srv.json("status", job_id)
    local = srv.tg.json("status", job_id)
    assert remote == local  # the same shape, read over HTTP or from the store
    assert remote["attempts"] == 2 and remote["restarts"] == 1
    records = srv.json("records", job_id)
    assert len(records) == 1 and records[0]["failure_class"]
    assert srv.json("records", job_id, "--aggregate")[0]["count"] >= 1
    assert srv.json("explain", job_id)["failures"]
    assert srv.json("goodput", job_id)["job"]["id"] == job_id
    assert srv.json("stacks", job_id) == []
    logs = srv.cli("logs", job_id, "--replica", "worker-1")
    assert logs.returncode == 0 and "hello 1" in logs.stdout
    listed = srv.json("jobs")
    assert [j["id"] for j in listed] == [job_id]


@pytest.mark.slow
def test_quota_queues_fifo_with_the_reason_and_runs_as_far_as_it_allows(
    server_factory: Any, tmp_path: Path
) -> None:
    srv = server_factory("--cpus", "2")
    gate = tmp_path / "gate"
    ids = [srv.submit("--nproc-per-node", "2", *gated(gate))]
    ids += [srv.submit("--nproc-per-node", "2", *sleeper(1)) for _ in range(2)]
    wait_for(lambda: srv.state(ids[0]) == "RUNNING", 30, "the first job to run")
    second = srv.json("status", ids[1])
    assert second["state"] == "QUEUED"
    assert second["queued_reason"] == "waiting for 2 cpus, 0 free"
    assert "behind" in srv.json("status", ids[2])["queued_reason"]
    gate.touch()
    for job_id in ids:
        assert srv.wait_state(job_id, "SUCCEEDED", "FAILED", timeout=90) == "SUCCEEDED"
    # Never two at once: each job was admitted after the one before it ended.
    spans = []
    for job_id in ids:
        rows = {t["to_state"]: t["at_s"] for t in _transitions(srv, job_id)}
        spans.append((rows["PENDING"], rows["SUCCEEDED"]))
    assert spans[0][1] <= spans[1][0] and spans[1][1] <= spans[2][0]


def _transitions(srv: Server, job_id: str) -> list[dict[str, Any]]:
    return list(srv.http("GET", f"/api/jobs/{job_id}/history")[1]["transitions"])


@pytest.mark.slow
def test_max_wait_expires_and_an_oversized_job_is_refused_or_waits(server_factory: Any) -> None:
    srv = server_factory("--cpus", "1")
    first = srv.submit(*sleeper(30))
    expiring = srv.submit("--max-wait", "1", *sleeper(1))
    assert srv.wait_state(expiring, "EXPIRED", timeout=30) == "EXPIRED"
    status = srv.json("status", expiring)
    assert status["error_code"] == "EXPIRED" and "max_wait_s is 1" in status["error_message"]

    too_big = srv.cli("submit", "--nproc-per-node", "4", *sleeper(1))
    assert too_big.returncode == 2
    assert (
        "4 cpus, 1 in the whole quota" in too_big.stderr and "wait_for_capacity" in too_big.stderr
    )
    assert "Traceback" not in too_big.stderr

    waiting = srv.submit("--nproc-per-node", "4", "--wait-for-capacity", *sleeper(1))
    wait_for(
        lambda: (srv.json("status", waiting)["queued_reason"] or "").startswith(
            "waiting for capacity"
        ),
        30,
        "the capacity reason",
    )
    srv.cli("cancel", first)


@pytest.mark.slow
def test_cancel_queued_and_running_then_resume(server_factory: Any) -> None:
    srv = server_factory("--cpus", "1")
    running = srv.submit(*sleeper(60))
    queued = srv.submit(*sleeper(1))
    srv.wait_state(running, "RUNNING")
    res = srv.cli("cancel", queued)
    assert res.returncode == 0 and "CANCELLED" in res.stdout
    res = srv.cli("cancel", running)
    assert res.returncode == 0 and "CANCELLED" in res.stdout, res.stderr
    pids = [r["pid"] for r in srv.json("status", running)["replicas"]]
    assert pids and not any(alive(p) for p in pids)

    res = srv.cli("resume", queued)
    assert res.returncode == 0, res.stderr
    assert srv.wait_state(queued, "SUCCEEDED", "FAILED") == "SUCCEEDED"
    # A job that ended on its own cannot be resumed: a clear conflict, no traceback.
    again = srv.cli("resume", queued)
    assert again.returncode != 0 and "only an interrupted or cancelled" in again.stderr


@pytest.mark.slow
def test_server_restart_loses_nothing(server_factory: Any, tg: TG, tmp_path: Path) -> None:
    srv = server_factory("--cpus", "1")
    gate = tmp_path / "gate"
    long_job = srv.submit(*gated(gate))
    queued = srv.submit(*sleeper(0.5))
    srv.wait_state(long_job, "RUNNING")
    master = srv.json("status", long_job)["master_pid"]
    srv.kill()  # SIGKILL: no goodbye
    assert alive(master)  # the job's master lives in its own session

    srv2 = server_factory("--cpus", "1")
    assert srv2.state(queued) == "QUEUED"
    gate.touch()
    assert srv2.wait_state(long_job, "SUCCEEDED", "FAILED", timeout=60) == "SUCCEEDED"
    assert srv2.wait_state(queued, "SUCCEEDED", "FAILED", timeout=60) == "SUCCEEDED"


@pytest.mark.slow
def test_a_job_whose_master_died_is_resumed_by_the_server(
    server_factory: Any, tmp_path: Path
) -> None:
    """The job waits on a gate until its master is killed and resumed: a slow machine
    cannot let the first attempt end before the kill."""
    srv = server_factory("--cpus", "2")
    gate = tmp_path / "gate"
    job_id = srv.submit("--nproc-per-node", "2", *gated(gate))
    srv.wait_state(job_id, "RUNNING")
    os.kill(srv.json("status", job_id)["master_pid"], signal.SIGKILL)
    wait_for(lambda: srv.json("status", job_id)["attempts"] == 2, 60, "the resumed attempt")
    gate.touch()
    assert srv.wait_state(job_id, "SUCCEEDED", "FAILED", timeout=90) == "SUCCEEDED"
    reasons = [t["reason"] for t in _transitions(srv, job_id)]
    assert "auto-resume: its master was lost" in reasons
    assert srv.json("status", job_id)["attempts"] == 2


def test_token_is_required_off_loopback_and_checked(server_factory: Any, tg: TG) -> None:
    res = tg("server", "--host", "0.0.0.0", "--port", "0")
    assert res.returncode == 2 and "needs a token" in res.stderr
    srv = server_factory("--token", "s3cret")
    with pytest.raises(urllib.error.HTTPError) as err:
        srv.http("GET", "/api/jobs", token=None)
    assert err.value.code == 401
    err.value.close()
    assert srv.http("GET", "/api/jobs", token="s3cret") == (200, [])
    denied = srv.cli("jobs", token=None)
    assert denied.returncode != 0 and "token" in denied.stderr and "Traceback" not in denied.stderr
    assert srv.cli("jobs", token="s3cret").returncode == 0
    with urllib.request.urlopen(srv.url + "/healthz", timeout=5) as resp:
        assert resp.status == 200


def test_a_default_server_is_never_open(server_factory: Any, tg: TG) -> None:
    """No token given: one is made at first start in a 0600 file that this user's CLI
    reads; a request without it is refused, and the next start keeps the same one."""
    srv = server_factory()
    made = tg.home / "server.token"
    assert made.stat().st_mode & 0o777 == 0o600 and srv.home_token
    with pytest.raises(urllib.error.HTTPError) as err:
        srv.http("GET", "/api/jobs", token=None)
    assert err.value.code == 401
    err.value.close()
    assert srv.http("GET", "/api/jobs") == (200, [])
    assert srv.cli("jobs", "--json").returncode == 0  # no flag: the CLI read the file
    job_id = srv.submit("--", "true")
    assert srv.wait_state(job_id, "SUCCEEDED", "FAILED") == "SUCCEEDED"
    srv.stop()
    again = server_factory()
    assert again.home_token == srv.home_token  # the same token on every start
    made.chmod(0o644)
    res = again.cli("jobs")
    assert res.returncode == 2 and "readable by other users; chmod 600" in res.stderr
    made.chmod(0o600)
    again.stop()
    made.unlink()
    open_srv = server_factory("--no-token")
    assert not made.exists() and open_srv.http("GET", "/api/jobs", token=None)[0] == 200
    res = tg("server", "--no-token", "--host", "0.0.0.0", "--port", "0")
    assert res.returncode == 2 and "needs a token" in res.stderr


def test_bad_input_is_named_and_nothing_is_stored(server_factory: Any) -> None:
    srv = server_factory()
    with pytest.raises(urllib.error.HTTPError) as err:
        srv.http("POST", "/api/jobs", {"spec": {"name": "x", "worker_pools": [{"replicas": 0}]}})
    assert err.value.code == 422
    body = json.loads(err.value.read())
    err.value.close()
    assert "worker_pools[0].replicas: must be >= 1, got 0" in body["problems"]
    assert "worker_pools[0].command: is required" in body["problems"]
    with pytest.raises(urllib.error.HTTPError) as err:
        srv.http("GET", "/api/jobs/..%2F..%2Fetc")
    assert err.value.code in (404, 422)
    err.value.close()
    missing = srv.cli("status", "nope")
    assert missing.returncode != 0 and "no job with id or name 'nope'" in missing.stderr
    assert srv.json("jobs") == []


def test_metrics_in_prometheus_format(server_factory: Any) -> None:
    parser = pytest.importorskip("prometheus_client.parser")  # the test extra
    text_string_to_metric_families = parser.text_string_to_metric_families

    srv = server_factory("--cpus", "2")
    job_id = srv.submit(
        "--nproc-per-node", "2", "--", *child("1@0:signal:SIGKILL", "0:sleep:1", "*:print:ok")
    )
    assert srv.wait_state(job_id, "SUCCEEDED", "FAILED") == "SUCCEEDED"
    scrape = urllib.request.Request(srv.url + "/metrics")  # as Prometheus sends it
    scrape.add_header("Authorization", f"Bearer {srv.home_token}")
    with urllib.request.urlopen(scrape, timeout=10) as resp:
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    jobs = {s.labels["state"]: s.value for s in families["trainguard_jobs"].samples}
    assert jobs["SUCCEEDED"] == 1
    restarts = families["trainguard_restarts"].samples
    assert sum(s.value for s in restarts if s.name.endswith("_total")) == 1
    detect = {s.name: s.value for s in families["trainguard_detection_seconds"].samples}
    assert detect["trainguard_detection_seconds_count"] == 1
    assert "trainguard_queue_length" in families


def test_submit_without_a_server_says_how_to_get_one(tg: TG, tmp_path: Path) -> None:
    res = tg("submit", *sleeper(1))
    assert res.returncode == 2 and "no server" in res.stderr
    res = tg("jobs", "--server", "http://127.0.0.1:9")
    assert res.returncode != 0 and "cannot reach the trainguard server" in res.stderr


@pytest.mark.slow
def test_gpu_ids_from_the_quota_are_handed_out_per_job(server_factory: Any, tmp_path: Path) -> None:
    srv = server_factory("--cpus", "4", "--gpus", "0,1,2")
    gate = tmp_path / "gate"
    spec = tmp_path / "gpu.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "gpu-job",
                "worker_pools": [
                    {
                        "replicas": 1,
                        "resources": {"gpus": 1},
                        "command": child("*:env:CUDA_VISIBLE_DEVICES", f"*:wait-file:{gate}"),
                    }
                ],
            }
        )
    )
    ids = [srv.submit("-f", str(spec)) for _ in range(4)]
    wait_for(
        lambda: all(srv.state(i) == "RUNNING" for i in ids[:3]), 30, "three jobs on three GPUs"
    )
    assert srv.json("status", ids[3])["queued_reason"] == "waiting for 1 gpus, 0 free"
    gate.touch()  # the three finish; the fourth gets a GPU
    seen = []
    for job_id in ids:
        assert srv.wait_state(job_id, "SUCCEEDED", "FAILED") == "SUCCEEDED"
        seen.append(srv.cli("logs", job_id).stdout.strip())
    visible = [line.split("=", 1)[1] for line in seen]
    assert sorted(visible[:3]) == ["0", "1", "2"]  # each running job had its own GPU
    assert visible[3] in ("0", "1", "2")
