"""The SDK channel end to end: the real client (`trainguard.sdk`) against a real SdkServer.

The server runs on an asyncio loop in a background thread; the client is called from the
test thread, as training code would call it. Any SdkWarning a test does not expect fails it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest
from sdk_harness import (  # noqa: F401  (fixtures)
    ENV_NAMES,
    REPLICA,
    WAIT_S,
    Loop,
    Master,
    Recorder,
    clean_sdk,
    hang_values,
    loop,
    master,
    point_sdk_at,
    sdk_warnings,
    under_trainguard,
)

from trainguard import sdk
from trainguard.backends.net import free_port
from trainguard.master import sdk_channel as sdk_server
from trainguard.storage.ids import new_token

pytestmark = pytest.mark.filterwarnings("error::trainguard.sdk.SdkWarning")

# ---------------------------------------------------------------- client against server


def test_heartbeat_with_and_without_step(under_trainguard: Master) -> None:
    assert sdk.enabled()
    sdk.heartbeat(42)
    sdk.heartbeat()
    assert under_trainguard.recorder.calls == [
        ("heartbeat", REPLICA, 42),
        ("heartbeat", REPLICA, None),
    ]


def test_hang_detect_context_manager_nests_and_restores(under_trainguard: Master) -> None:
    with sdk.hang_detect(180):
        with sdk.hang_detect(-1):
            pass
        with pytest.raises(KeyError), sdk.hang_detect(30):
            raise KeyError("the scope still closes")
    assert hang_values(under_trainguard.recorder) == [180.0, -1.0, 180.0, 30.0, 180.0, None]


def test_hang_detect_decorator(under_trainguard: Master) -> None:
    @sdk.hang_detect(45)
    def save_checkpoint(x: int) -> int:
        """Doc kept."""
        return x * 2

    assert save_checkpoint(2) == 4
    with sdk.hang_detect(-1):
        assert save_checkpoint(3) == 6
    assert save_checkpoint.__name__ == "save_checkpoint"
    assert save_checkpoint.__doc__ == "Doc kept."
    assert hang_values(under_trainguard.recorder) == [45.0, None, -1.0, 45.0, -1.0, None]


def test_hang_detect_scopes_across_threads(under_trainguard: Master) -> None:
    """A's scope ends while B's, entered later, is still open: B's value stays in force."""
    a_entered, b_entered, a_exited = threading.Event(), threading.Event(), threading.Event()

    def a() -> None:
        with sdk.hang_detect(100):
            a_entered.set()
            b_entered.wait(WAIT_S)
        a_exited.set()

    def b() -> None:
        a_entered.wait(WAIT_S)
        with sdk.hang_detect(50):
            b_entered.set()
            a_exited.wait(WAIT_S)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert hang_values(under_trainguard.recorder) == [100.0, 50.0, 50.0, None]


def test_set_retryable_errors_and_custom_message(under_trainguard: Master) -> None:
    sdk.set_retryable_errors([r"NCCL timeout \d+", "flaky"])
    sdk.set_retryable_errors([])
    sdk.send_custom_message("eval loss 1.72")
    assert under_trainguard.recorder.calls == [
        ("retryable_errors", REPLICA, [r"NCCL timeout \d+", "flaky"]),
        ("retryable_errors", REPLICA, []),
        ("message", REPLICA, "eval loss 1.72"),
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: sdk.hang_detect(0), ValueError),
        (lambda: sdk.hang_detect(-2), ValueError),
        (lambda: sdk.hang_detect(float("nan")), ValueError),
        (lambda: sdk.hang_detect(float("inf")), ValueError),
        (lambda: sdk.hang_detect(True), TypeError),
        (lambda: sdk.hang_detect("5"), TypeError),  # type: ignore[arg-type]
        (lambda: sdk.heartbeat("7"), TypeError),  # type: ignore[arg-type]
        (lambda: sdk.heartbeat(-1), TypeError),
        (lambda: sdk.set_retryable_errors("one string"), TypeError),  # type: ignore[arg-type]
        (lambda: sdk.set_retryable_errors([1]), TypeError),  # type: ignore[list-item]
        (lambda: sdk.send_custom_message(None), TypeError),  # type: ignore[arg-type]
    ],
)
def test_wrong_arguments_raise(call: object, error: type[Exception]) -> None:
    """A bug in the caller, not a fault of the master: raised, whether under trainguard or not."""
    with pytest.raises(error):
        call()  # type: ignore[operator]


def test_wrong_token_warns_once_and_never_raises(
    master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    point_sdk_at(monkeypatch, master.server.url, "not-the-token")
    with sdk_warnings() as texts:
        sdk.heartbeat(1)
        sdk.set_retryable_errors(["x"])
        with sdk.hang_detect(10):
            sdk.send_custom_message("hi")
    assert len(texts) == 1
    assert "refused" in texts[0] and "401" in texts[0]
    assert master.recorder.calls == []


def test_handler_error_answers_500_and_client_warns(under_trainguard: Master) -> None:
    under_trainguard.recorder.fail = True
    with sdk_warnings() as texts:
        sdk.heartbeat(1)
    assert len(texts) == 1 and "500" in texts[0]
    under_trainguard.recorder.fail = False
    sdk.heartbeat(2)  # the server carries on, on the same connection
    assert under_trainguard.recorder.calls == [("heartbeat", REPLICA, 2)]


def test_master_down_warns_once_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    point_sdk_at(monkeypatch, f"http://127.0.0.1:{free_port()}", "token")
    started = time.monotonic()
    with sdk_warnings() as texts:
        sdk.heartbeat(1)
        with sdk.hang_detect(60):
            sdk.heartbeat(2)
        sdk.set_retryable_errors(["x"])
        sdk.send_custom_message("hi")
    assert time.monotonic() - started < sdk.channel._TIMEOUT_S
    assert len(texts) == 1 and "unreachable" in texts[0]


def test_state_lost_while_master_down_is_sent_when_it_answers(
    loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats are dropped while the master is away (and for a short quiet spell after),
    but the scope in force and the retryable patterns reach it once it answers again."""
    quiet_s = 0.2
    monkeypatch.setattr(sdk.channel, "_RETRY_AFTER_S", quiet_s)
    port, token, recorder = free_port(), new_token(), Recorder()
    point_sdk_at(monkeypatch, f"http://127.0.0.1:{port}", token)
    with sdk_warnings() as texts, sdk.hang_detect(-1):
        sdk.set_retryable_errors(["flaky"])
        server = loop.serve(recorder, token, port=port)
        sdk.heartbeat(1)  # within the quiet spell: dropped
        time.sleep(quiet_s * 2)
        sdk.heartbeat(2)
    loop.run(server.close())
    assert len(texts) == 1 and "unreachable" in texts[0]
    assert sorted(recorder.calls[:2], key=str) == [
        ("hang_detect", REPLICA, -1.0),
        ("retryable_errors", REPLICA, ["flaky"]),
    ]
    assert recorder.calls[2:] == [("heartbeat", REPLICA, 2), ("hang_detect", REPLICA, None)]


def test_client_reconnects_when_the_server_closed_an_idle_connection(
    under_trainguard: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle_s = 0.05
    monkeypatch.setattr(sdk_server, "_IDLE_TIMEOUT_S", idle_s)
    sdk.heartbeat(1)  # this connection starts its idle wait with the patched limit
    time.sleep(idle_s * 6)
    sdk.heartbeat(2)
    assert under_trainguard.recorder.calls == [
        ("heartbeat", REPLICA, 1),
        ("heartbeat", REPLICA, 2),
    ]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, sdk.ENV_MASTER_URL),
        ({sdk.ENV_MASTER_URL: "http://127.0.0.1:1"}, sdk.ENV_TOKEN),
        (
            {sdk.ENV_MASTER_URL: "https://x:1", sdk.ENV_TOKEN: "t", sdk.ENV_REPLICA: "w"},
            "not http://host:port",
        ),
        (
            {sdk.ENV_MASTER_URL: "http://x:port", sdk.ENV_TOKEN: "t", sdk.ENV_REPLICA: "w"},
            "not http://host:port",
        ),
    ],
)
def test_outside_trainguard_every_call_is_a_no_op_with_one_warning(
    env: dict[str, str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with sdk_warnings() as texts:
        assert not sdk.enabled()
        sdk.heartbeat(1)
        sdk.heartbeat()
        with sdk.hang_detect(60):
            sdk.set_retryable_errors(["x"])
        sdk.send_custom_message("hi")
    assert len(texts) == 1 and expected in texts[0]


def test_warning_points_at_the_training_code() -> None:
    @sdk.hang_detect(5)
    def step() -> None:
        pass

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step()
    (warning,) = caught
    assert warning.filename == __file__


def test_round_trip_cost(under_trainguard: Master) -> None:
    """One heartbeat on the persistent connection, median of many: well under a step."""
    calls = 200
    sdk.heartbeat(0)  # connect first
    costs = []
    for step in range(calls):
        started = time.perf_counter()
        sdk.heartbeat(step)
        costs.append(time.perf_counter() - started)
    median_ms = statistics.median(costs) * 1000
    print(f"heartbeat round trip: median {median_ms:.3f} ms over {calls} calls")
    assert len(under_trainguard.recorder.calls) == calls + 1
    assert median_ms < 50


# ---------------------------------------------------------------- a real training process


REPLICA_SCRIPT = textwrap.dedent(
    """
    import os, signal
    from trainguard import sdk

    assert sdk.enabled()
    sdk.heartbeat(7)
    with sdk.hang_detect(60):
        sdk.heartbeat()

    @sdk.hang_detect(-1)
    def save():
        pass

    save()
    sdk.set_retryable_errors([r"flaky \\d+"])
    sdk.send_custom_message("hello from the replica")
    os.kill(os.getpid(), signal.SIGUSR2)  # faulthandler dumps the stacks; the process lives on
    print("done")
    """
)


@pytest.mark.slow
def test_replica_process_reaches_the_master(under_trainguard: Master, tmp_path: Path) -> None:
    dump = tmp_path / "stacks.txt"
    env = {**os.environ, sdk.ENV_FAULTHANDLER_FILE: str(dump)}
    run = subprocess.run(
        [sys.executable, "-c", REPLICA_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "done"
    assert "SdkWarning" not in run.stderr
    assert under_trainguard.recorder.calls == [
        ("faulthandler", REPLICA),
        ("heartbeat", REPLICA, 7),
        ("hang_detect", REPLICA, 60.0),
        ("heartbeat", REPLICA, None),
        ("hang_detect", REPLICA, None),
        ("hang_detect", REPLICA, -1.0),
        ("hang_detect", REPLICA, None),
        ("retryable_errors", REPLICA, [r"flaky \d+"]),
        ("message", REPLICA, "hello from the replica"),
    ]
    assert "most recent call first" in dump.read_text()


IMPORT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    started = time.perf_counter()
    from trainguard import sdk
    took = time.perf_counter() - started
    heavy = [m for m in ("pydantic", "sqlalchemy", "yaml", "http.client") if m in sys.modules]
    print(took, *heavy)
    """
)


@pytest.mark.slow
def test_import_is_fast_and_light() -> None:
    """Training code pays milliseconds for the import; http.client waits for the first call."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    run = subprocess.run(
        [sys.executable, "-c", IMPORT_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    took, *heavy = run.stdout.split()
    assert heavy == []
    assert float(took) < 0.5


def test_a_preemption_notice_reaches_the_training_code(under_trainguard: Master) -> None:
    """Issue 19: Slurm's warning signal to the master becomes `sdk.preempted()` at the next
    SDK call of every replica (the real Inbox's answer)."""
    from trainguard.master.inbox import Inbox

    inbox = Inbox.__new__(Inbox)
    inbox.pending_exit, inbox.preempt = {}, None
    under_trainguard.recorder.command_for = inbox.command_for  # type: ignore[attr-defined]
    sdk.heartbeat(1)
    assert sdk.preempted() is None
    inbox.preempt = "SIGUSR1 to the master (sbatch --signal=B:USR1@SECONDS)"
    sdk.heartbeat(2)
    assert sdk.preempted() == inbox.preempt
    assert inbox.command_for("worker-0") == {"preempt": inbox.preempt}  # every answer


def test_preempted_outside_trainguard_is_none() -> None:
    assert sdk.preempted() is None
