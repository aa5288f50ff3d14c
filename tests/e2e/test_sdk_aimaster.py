"""AIMaster's job_monitor surface (trainguard.aimaster): against a real SdkServer, outside
trainguard, and AIMaster's documented staged-hang example under a real master."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import TG
from sdk_harness import (  # noqa: F401  (fixtures)
    REPLICA,
    Master,
    clean_sdk,
    hang_values,
    loop,
    master,
    point_sdk_at,
    sdk_warnings,
    under_trainguard,
)

from trainguard.aimaster import job_monitor as jm
from trainguard.backends.net import free_port


def test_a_script_written_for_aimaster_talks_to_the_master(under_trainguard: Master) -> None:
    monitor = jm.Monitor(config=jm.PyTorchConfig(job_hang_interval=1800))
    assert monitor.set_retryable_errors(["connect timeout", "error_yyy"]).ok()
    assert monitor.reset_config(job_hang_interval=10).ok()
    assert monitor.reset_config({"job_hang_interval": 20}).ok()

    @jm.hang_detect(-1)
    def test_phase() -> str:
        return "evaluated"

    assert test_phase() == "evaluated"
    st = monitor.send_custom_message(content="The training loss of the job is NaN.")
    assert st.ok() and st.to_string() == "OK: custom message"
    calls = under_trainguard.recorder.calls
    assert ("retryable_errors", REPLICA, ["connect timeout", "error_yyy"]) in calls
    assert ("message", REPLICA, "The training loss of the job is NaN.") in calls
    # the config's interval, two resets, then the decorated scope and back to the reset
    assert hang_values(under_trainguard.recorder) == [1800.0, 10.0, 20.0, -1.0, 20.0]
    assert jm.TFConfig(job_hang_interval=5).params == {"job_hang_interval": 5}


def test_parameters_of_the_launch_are_said_to_have_no_effect(under_trainguard: Master) -> None:
    monitor = jm.Monitor()
    with sdk_warnings() as texts:
        st = monitor.reset_config(enable_job_hang_detection=True)
    assert st.ok() and len(texts) == 1 and "enable_job_hang_detection" in texts[0]


def test_outside_trainguard_every_status_says_nothing_was_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TRAINGUARD_MASTER_URL", "TRAINGUARD_TOKEN", "TRAINGUARD_REPLICA"):
        monkeypatch.delenv(name, raising=False)
    with sdk_warnings() as texts:
        st = jm.Monitor(config=jm.PyTorchConfig()).send_custom_message(content="hi")
    assert not st.ok() and "not started by trainguard" in st.to_string()
    assert len(texts) == 1 and "not started by trainguard" in texts[0]


def test_a_master_that_is_down_is_a_status_not_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    point_sdk_at(monkeypatch, f"http://127.0.0.1:{free_port()}", "token")
    with sdk_warnings() as texts:
        st = jm.Monitor().send_custom_message(content="hi")
    assert not st.ok() and "unreachable" in st.to_string() and len(texts) == 1


# AIMaster's staged hang detection example (its documentation, "Configure staged job hang
# detection"), with the import line changed and `...` filled in: a training phase with a
# 1.5 s interval and an evaluation phase with detection off. The evaluation is silent for
# 3 s (past the job's 2 s interval): not a hang. The second epoch's training stalls.
STAGED = """
import os, sys, time
from trainguard.aimaster import job_monitor as jm

jm_config_params = {
    "job_hang_interval": 2
}
jm_config = jm.PyTorchConfig(**jm_config_params)
monitor = jm.Monitor(config=jm_config)

def reset_hang_detect(hang_seconds):
    jm_config_params = {
        "job_hang_interval": hang_seconds
    }
    monitor.reset_config(**jm_config_params)

hang_detect = jm.hang_detect

restart = int(os.environ["TRAINGUARD_RESTART_COUNT"])

@hang_detect(1.5)
def train(epoch):
    for step in range(5):
        print(f"train epoch {epoch} step {step}", flush=True)
        time.sleep(0.2)
    if epoch == 1 and restart == 0:
        print("stalling in training", flush=True)
        time.sleep(600)

@hang_detect(-1)
def test(epoch):
    print(f"evaluating epoch {epoch}, silent for 3 s", flush=True)
    time.sleep(3)

for epoch in range(0, 2):
    train(epoch)
    test(epoch)
print("done", flush=True)
"""


@pytest.mark.slow
def test_aimasters_staged_hang_example_as_documented(tg: TG, tmp_path: Path) -> None:
    script = tmp_path / "staged.py"
    script.write_text(textwrap.dedent(STAGED))
    res = tg("run", "--quiet", "--no-preload", "--", sys.executable, str(script), timeout=240)
    assert res.returncode == 0, res.stderr
    job = tg.only_job()
    assert (job["state"], job["attempts"]) == ("SUCCEEDED", 2), job
    (f,) = tg.json("explain", job["id"])["failures"]
    assert f["failure_class"] == "hang", f
    assert "interval 1.5 s" in json.dumps(f), f  # the training phase's, not the job's 2 s
    log0 = tg("logs", job["id"], "--attempt", "0").stdout
    assert "evaluating epoch 0, silent for 3 s" in log0 and "train epoch 1 step 0" in log0
    assert "stalling in training" in log0  # the hang was in training, not in the silence
    assert "done" in tg("logs", job["id"]).stdout
