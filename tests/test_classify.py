"""Table tests for exit classification (R-CLS-1, R-CLS-2): no processes (signal spellings:
tests/test_signals.py)."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.policy.classes import Classification, ExitEvidence, ExitKind, FailureClass
from trainguard.policy.classify import classify_by_rules, classify_exit
from trainguard.policy.learned import SURE

REPLICA = "worker-1"

TRACEBACK_KEYERROR = (
    "step 10 loss 0.5",
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 12, in <module>',
    "    main()",
    '  File "/app/train.py", line 8, in main',
    "    batch = cfg['x']",
    "            ~~~^^^^^",
    "KeyError: 'x'",
)


def _classify(returncode: int | None, **kw: Any) -> Classification:
    return classify_exit(ExitEvidence(REPLICA, returncode, **kw))


# ---------------------------------------------------------------- classify_exit


def test_clean_exit() -> None:
    c = _classify(0)
    assert c.kind is ExitKind.CLEAN
    assert c.failure_class is None
    assert c.is_failure is False
    assert c.retryable is False
    assert c.exit_code == 0
    assert c.signal is None
    assert c.rule == "clean-exit"


def test_asked_to_stop_but_finished_first_is_a_clean_exit() -> None:
    c = _classify(0, stop_requested=True)
    assert (c.kind, c.is_failure) == (ExitKind.CLEAN, False)


@pytest.mark.parametrize("returncode", [-15, 143, -9, 1])
def test_stop_requested_is_never_a_failure(returncode: int) -> None:
    c = _classify(returncode, stop_requested=True)
    assert c.kind is ExitKind.STOP_REQUESTED
    assert c.failure_class is None
    assert c.is_failure is False
    assert c.retryable is False
    assert c.rule == "stop-requested"


def test_stop_requested_sigterm_keeps_its_code() -> None:
    c = _classify(-15, stop_requested=True)
    assert (c.exit_code, c.signal) == (143, "SIGTERM")


@pytest.mark.parametrize(
    ("returncode", "code", "sig"),
    [
        (-11, 139, "SIGSEGV"),
        (139, 139, "SIGSEGV"),
        (-6, 134, "SIGABRT"),
        (134, 134, "SIGABRT"),
    ],
)
def test_transient_signals(returncode: int, code: int, sig: str) -> None:
    # a traceback long before the death does not explain it: the signal decides
    old = (*TRACEBACK_KEYERROR, *(f"step {i} loss 0.1" for i in range(10)))
    c = _classify(returncode, log_tail=old)
    assert c.kind is ExitKind.SIGNAL
    assert c.failure_class is FailureClass.TRANSIENT_EXIT
    assert c.is_failure is True
    assert c.retryable is True
    assert c.exit_code == code
    assert c.signal == sig
    assert c.reason == sig
    assert c.rule == f"transient-signal-{sig}"
    assert c.message == (
        f"The replica worker-1 exited with a non-zero status of {code}. Termination reason: {sig}."
    )


def test_sigsegv_message_exactly() -> None:
    for rc in (-11, 139):
        assert _classify(rc).message == (
            "The replica worker-1 exited with a non-zero status of 139. "
            "Termination reason: SIGSEGV."
        )


@pytest.mark.parametrize(
    ("returncode", "code", "sig"),
    [
        (-9, 137, "SIGKILL"),
        (137, 137, "SIGKILL"),
        (-15, 143, "SIGTERM"),
        (143, 143, "SIGTERM"),
        (-2, 130, "SIGINT"),
    ],
)
def test_external_kill_is_preemption(returncode: int, code: int, sig: str) -> None:
    c = _classify(returncode)
    assert c.kind is ExitKind.SIGNAL
    assert c.failure_class is FailureClass.PREEMPTION
    assert c.retryable is True
    assert c.exit_code == code
    assert c.signal == sig
    assert c.rule == f"external-{sig}"
    assert sig in c.message
    assert c.message == (
        f"The replica worker-1 exited with a non-zero status of {code}. "
        f"Termination reason: {sig} (killed from outside trainguard)."
    )


@pytest.mark.parametrize("returncode", [-9, 137])
def test_sigkill_with_oom_kill_is_host_oom(returncode: int) -> None:
    c = _classify(returncode, oom_kills=1)
    assert c.failure_class is FailureClass.HOST_OOM
    assert c.retryable is False  # as Vertex: the same job on the same machine runs out again
    assert c.rule == "host-oom-cgroup"
    assert c.reason == "OOMKilled"
    assert c.exit_code == 137
    assert c.signal == "SIGKILL"
    assert c.message == (
        "The replica worker-1 ran out of memory and exited with a non-zero status of 137."
    )


def test_oom_kill_does_not_turn_sigterm_into_oom() -> None:
    c = _classify(-15, oom_kills=2)
    assert c.failure_class is FailureClass.PREEMPTION


def test_exit_1_with_traceback_is_user_error() -> None:
    c = _classify(1, log_tail=TRACEBACK_KEYERROR)
    assert c.kind is ExitKind.NONZERO
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.retryable is False
    assert c.rule == "python-bug"  # the catalogue's signature for common Python exceptions
    assert c.reason == "KeyError: 'x'"
    assert c.matched_line == "KeyError: 'x'"
    assert c.exit_code == 1
    assert c.signal is None
    assert c.message == (
        "The replica worker-1 exited with a non-zero status of 1. "
        "Termination reason: KeyError: 'x'."
    )


@pytest.mark.parametrize("returncode", [1, 2, 128, 255])
def test_nonzero_without_traceback_is_user_error(returncode: int) -> None:
    c = _classify(returncode, log_tail=("loading data", "giving up"))
    assert c.kind is ExitKind.NONZERO
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.retryable is False
    assert c.rule == "nonzero-exit"
    assert c.reason == "Error"
    assert c.matched_line is None
    assert c.exit_code == returncode
    assert c.signal is None
    assert c.message == (
        f"The replica worker-1 exited with a non-zero status of {returncode}. "
        "Termination reason: Error."
    )


def test_spawn_error() -> None:
    c = _classify(None, spawn_error="command not found: 'nope'")
    assert c.kind is ExitKind.SPAWN_ERROR
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.is_failure is True
    assert c.retryable is False
    assert c.rule == "spawn-error"
    assert c.exit_code is None
    assert c.signal is None
    assert c.reason == "command not found: 'nope'"
    assert c.message == "The replica worker-1 could not be started: command not found: 'nope'."


def test_spawn_error_without_detail() -> None:
    c = _classify(None)
    assert c.kind is ExitKind.SPAWN_ERROR
    assert c.reason == "the command could not be started"


@pytest.mark.parametrize("returncode", [-7, 135])
def test_sigbus_is_not_transient_by_default(returncode: int) -> None:
    # TRANSIENT_SIGNALS is SIGABRT and SIGSEGV only; any other signal not sent from outside
    # (SIGKILL/SIGTERM/SIGINT) is the program's own fault: a user error, not retried.
    c = _classify(returncode)
    assert c.kind is ExitKind.SIGNAL
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.retryable is False
    assert c.rule == "other-signal"
    assert c.reason == "SIGBUS"
    assert c.exit_code == 135
    assert c.signal == "SIGBUS"
    assert c.message == (
        "The replica worker-1 exited with a non-zero status of 135. Termination reason: SIGBUS."
    )


def test_sigbus_with_traceback_reports_the_exception() -> None:
    c = _classify(-7, log_tail=TRACEBACK_KEYERROR)
    assert c.failure_class is FailureClass.USER_ERROR
    assert c.rule == "python-traceback"
    assert c.reason == "KeyError: 'x'"


@pytest.mark.parametrize("returncode", [-6, 134])
def test_an_uncaught_exception_then_an_abort_at_exit_is_the_exception(returncode: int) -> None:
    """gloo's threads make the interpreter abort on its way out after an uncaught error."""
    tail = (
        "step 19 loss 0.2",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 113, in main',
        "[rank1]: KeyError: 'lr'",
        "terminate called without an active exception",
    )
    c = _classify(returncode, log_tail=tail)
    assert (c.failure_class, c.retryable, c.reason) == (
        FailureClass.USER_ERROR,
        False,
        "KeyError: 'lr'",
    )


def test_an_old_traceback_long_before_a_segfault_does_not_explain_it() -> None:
    tail = (
        "Traceback (most recent call last):",
        '  File "train.py", line 3, in <module>',
        "KeyError: 'x'",
        *(f"step {i} loss 0.1" for i in range(20)),
    )
    assert _classify(-11, log_tail=tail).failure_class is FailureClass.TRANSIENT_EXIT


# What rank 1 of a Lightning DDP job printed before it aborted at exit in a CI run, its
# peer having exited 0 (the gloo-threads-at-exit race of pytorch/pytorch#179291).
_LIGHTNING_ABORT_AT_EXIT = (
    "GPU available: False, used: False",
    "TPU available: False, using: 0 TPU cores",
    "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2",
    "`Trainer.fit` stopped: `max_epochs=2` reached.",
    "weights of rank 1: 0.1234567",
    "terminate called without an active exception",
)


@pytest.mark.parametrize("returncode", [-6, -11])
def test_a_bare_crash_after_every_peer_finished_is_a_crash_at_exit(returncode: int) -> None:
    ev = ExitEvidence("worker-1", returncode, log_tail=_LIGHTNING_ABORT_AT_EXIT, progressed=True)
    alone = classify_exit(ev)
    assert "transient-signal" in alone.rule and alone.confidence < 0.7
    c = classify_exit(ExitEvidence(**{**ev.__dict__, "peers_finished": True}))
    assert c.failure_class is FailureClass.TRANSIENT_EXIT and c.retryable
    assert c.rule == f"crash-at-exit-{c.signal}" and c.confidence >= 0.7
    assert "after every other replica had finished" in c.notes[-1]


def test_peers_that_finished_do_not_excuse_a_crash_with_a_cause() -> None:
    tail = ("RuntimeError: CUDA error: device-side assert triggered", "Aborted (core dumped)")
    c = classify_exit(ExitEvidence("worker-1", -6, log_tail=tail, peers_finished=True))
    assert not c.retryable and c.rule != "crash-at-exit-SIGABRT"


@pytest.mark.parametrize(
    ("line", "cls", "rule"),
    [
        ("salloc: Prolog failure on node k003-006", FailureClass.NODE_LOST, "node-lost"),
        (
            "salloc: error: Job allocation 235454 has been revoked",
            FailureClass.NODE_LOST,
            "node-lost",
        ),
        (
            "Reason=Node unexpectedly rebooted [slurm@2022-07-23T15:31:00]",
            FailureClass.NODE_LOST,
            "node-lost",
        ),
        (
            "WARNING:  allocated node           cu25-0 is in state Down",
            FailureClass.NODE_LOST,
            "node-lost",
        ),
        ("srun: error: Node failure on gpu-12", FailureClass.NODE_LOST, "node-lost"),
        ("Spot interruption payload received: {...}", FailureClass.PREEMPTION, "preemption-notice"),
        (
            "Instance is going to be interrupted in 2 minutes. Exiting...",
            FailureClass.PREEMPTION,
            "preemption-notice",
        ),
        (
            '"StatusReason": "Host EC2 (instance i-08784105f) terminated."',
            FailureClass.PREEMPTION,
            "preemption-notice",
        ),
        (
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
            FailureClass.RETRYABLE_MESSAGE,
            "scheduler-unreachable",
        ),
        (
            "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
            FailureClass.RETRYABLE_MESSAGE,
            "scheduler-unreachable",
        ),
        (
            "NVRM: RmInitAdapter failed! (0x26:0xffff:1127)",
            FailureClass.RETRYABLE_MESSAGE,
            "gpu-xid",
        ),
        (
            '"This step is in Error state with this message: pod deleted during operation"',
            FailureClass.NODE_LOST,
            "node-lost",
        ),
        (
            "ORTE has lost communication with a remote daemon.",
            FailureClass.NODE_LOST,
            "mpi-daemon-lost",
        ),
        (
            'FailureReason: "CapacityError: Unable to provision requested ML compute capacity."',
            FailureClass.CAPACITY,
            "capacity-exhausted",
        ),
        (
            "04/18/2016 22:55:25;0008;PBS_Server.1;Job;70;Job deleted at request of root@sched",
            FailureClass.PREEMPTION,
            "preemption-notice",
        ),
        (
            "ERROR trainable.py:597 -- Could not upload checkpoint even after 3 retries.",
            FailureClass.RETRYABLE_MESSAGE,
            "storage-io",
        ),
        (
            "E0511 18:18:50.796852 915 tpunetd_client.cc:311] Detected failure "
            "SLICE_FAILURE_CHIP_DRIVER_ERROR in session e6c8; Start failure handling",
            FailureClass.RETRYABLE_MESSAGE,
            "tpu-session-failure",
        ),
        (
            "RuntimeError: Maximum wait time reached, but only 1/32 nodes came up. Aborting.",
            FailureClass.CAPACITY,
            "capacity-exhausted",
        ),
        (
            "  - name: 'A resource limit has delayed the operation: generic::resource_exhausted:",
            FailureClass.CAPACITY,
            "capacity-exhausted",
        ),
        (
            "Failed to initialize TPU system with error: FAILED_PRECONDITION: open(/dev/vfio/0): "
            "Device or resource busy",
            FailureClass.CAPACITY,
            "no-gpu-available",
        ),
        (
            'Failed to pull image "gcr.io/x/y:v1": rpc error: desc = context canceled',
            FailureClass.RETRYABLE_MESSAGE,
            "image-pull-timeout",
        ),
        (
            "ClientError: Failed to download data. ListObjectsV2 failed for s3://b: Unable to "
            "execute request to S3",
            FailureClass.RETRYABLE_MESSAGE,
            "storage-io",
        ),
        (
            "ResourceLimitExceeded: An error occurred (ResourceLimitExceeded) when calling the "
            "CreateTrainingJob operation: The account-level service limit is 0 Instances",
            FailureClass.USER_ERROR,
            "account-quota",
        ),
        (
            "Orphaned CUDA contexts after 100s - container needs restart.",
            FailureClass.CAPACITY,
            "no-gpu-available",
        ),
        (
            "E1203 10:00:00.1  42 chttp2_transport.cc:2876] ipv4:10.0.0.7:40382: Keepalive "
            "watchdog fired. Closing transport.",
            FailureClass.RETRYABLE_MESSAGE,
            "network-timeout",
        ),
        (
            "wandb: ERROR Error communicating with backend",
            FailureClass.RETRYABLE_MESSAGE,
            "remote-connection-dropped",
        ),
        (
            "urllib3.exceptions.ResponseError: too many 500 error responses",
            FailureClass.RETRYABLE_MESSAGE,
            "remote-5xx",
        ),
        (
            "(1) Resource exhausted: Attempting to allocate 180.59M. That was not possible. "
            "There are 142.58M free.; (0x3x0_HBM1)",
            FailureClass.DEVICE_OOM,
            "cuda-oom",
        ),
    ],
)
def test_schedulers_clouds_and_services_own_words_are_read_by_their_signature(
    line: str, cls: FailureClass, rule: str
) -> None:
    """Slurm's, Open MPI's, Kubernetes' and the clouds' own words (Prolog failure, revoked
    allocation, spot notices, a lost daemon, an image pull cut off, a quota of 0), and
    XLA's device OOM: each read by its signature, not as a bare exit 1."""
    c = _classify(1, log_tail=("step 40 loss 0.3", line))
    assert (c.failure_class, c.rule) == (cls, rule)
    assert c.retryable is (cls not in (FailureClass.DEVICE_OOM, FailureClass.USER_ERROR))


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ("RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable", "gpu-busy"),
        ("No devices were found", "gpu-not-visible"),
        ("failed call to cuInit: CUDA_ERROR_NO_DEVICE", "gpu-not-visible"),
    ],
)
def test_gpus_taken_or_unseen_are_retried_once_not_surely(line: str, rule: str) -> None:
    """A GPU held by another process or unseen by the driver is a leftover process or a
    node fault as often as an exclusive-mode or setup error that recurs: an uncertain
    retry, which the learned model may overrule."""
    c = classify_by_rules(ExitEvidence(REPLICA, 1, log_tail=("step 40 loss 0.3", line)))
    assert (c.rule, c.retryable, c.uncertain) == (rule, True, True)


def test_a_checkpointer_that_asks_for_an_uninitialised_preemption_service_is_a_bug() -> None:
    """The word "preemption" in a library's own error is not a notice of one."""
    c = _classify(
        1,
        log_tail=(
            "step 40 loss 0.3",
            'RuntimeError("Preemption sync manager has not been initialized. Make sure '
            'jax.distributed.initialize() is called.")',
        ),
    )
    assert c.failure_class is not FailureClass.PREEMPTION


@pytest.mark.parametrize(
    ("line", "rule", "uncertain"),
    [
        ("NVRM: Xid (PCI:0000:18:00): 31, pid=34292, Ch 00000039, MMU Fault", "gpu-xid-app", True),
        ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception", "gpu-xid-app", True),
        ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", "gpu-xid", False),
        ("NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error", "gpu-xid", False),
    ],
)
def test_an_xid_that_is_most_often_the_jobs_own_fault_is_retried_once(
    line: str, rule: str, uncertain: bool
) -> None:
    """Xid 13/31/43 are mostly the application's bad memory access (NVIDIA's Xid table);
    79 (off the bus) and 48 (double-bit ECC) are the GPU's."""
    c = classify_by_rules(ExitEvidence(REPLICA, 1, log_tail=("step 40 loss 0.3", line)))
    assert (c.rule, c.retryable, c.uncertain) == (rule, True, uncertain)


@pytest.mark.parametrize(
    ("line", "cls", "rule"),
    [
        (
            "I0629 20:17:54.098071 140019624834816 error_handling.py:70] Error recorded from "
            "outfeed: Bad hardware status: 0x1",
            FailureClass.RETRYABLE_MESSAGE,
            "tpu-session-failure",
        ),
        (
            "E tensorflow/stream_executor/cuda/cuda_driver.cc:1002] failed to allocate 190.31M "
            "(199557120 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY",
            FailureClass.CAPACITY,
            "gpu-memory-grab-failed",
        ),
        (
            "CUDA driver initialization failed, you might not have a CUDA gpu.",
            FailureClass.RETRYABLE_MESSAGE,
            "cuda-driver-lost",
        ),
        (
            "INFO:tensorflow:An error was raised. This may be due to a preemption in a connected "
            "worker or parameter server. The current session will be closed and a new session "
            "will be created.",
            FailureClass.PREEMPTION,
            "preemption-maybe",
        ),
        (
            "requests.exceptions.ConnectionError: HTTPConnectionPool(host='0.0.0.0', port=8000): "
            "Max retries exceeded with url: /health/ (Caused by NewConnectionError(...))",
            FailureClass.USER_ERROR,
            "local-service-down",
        ),
        (
            "botocore.exceptions.EndpointConnectionError: Could not connect to the endpoint URL: "
            '"http://localhost:9000/bucket/custom_files/reward_function.py"',
            FailureClass.USER_ERROR,
            "local-service-down",
        ),
    ],
)
def test_what_a_line_says_of_its_own_certainty_is_kept(
    line: str, cls: FailureClass, rule: str
) -> None:
    """Lines from real logs of the corpus' development part, read by the rules alone: a TPU's
    hardware status, TensorFlow failing to reserve a GPU another
    process holds, a CUDA driver gone mid-run, TensorFlow's own hedge ("may be due to a
    preemption"), a service on this machine that is not listening. None of them is sure:
    each is a reading the learned model may still overrule."""
    c = classify_by_rules(ExitEvidence(REPLICA, 1, log_tail=("step 40 loss 0.3", line)))
    assert (c.failure_class, c.rule) == (cls, rule)
    assert c.confidence < SURE


def test_a_cuda_driver_missing_before_any_step_is_the_machines_set_up() -> None:
    line = "CUDA driver initialization failed, you might not have a CUDA gpu."
    c = classify_by_rules(ExitEvidence(REPLICA, 1, log_tail=(line,)))
    assert (c.rule, c.retryable) == ("cuda-driver-lost-untrained", False)


@pytest.mark.parametrize(
    "line",
    [
        # a remote service: the network or the service, not this machine's set-up
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='huggingface.co', "
        "port=443): Max retries exceeded with url: /api (Caused by NewConnectionError(...))",
        # the rendezvous store on this machine: a rank that dialled before rank 0 listened
        "torch.distributed.DistNetworkError: The client socket has failed to connect to "
        "[localhost]:29500 (errno: 111 - Connection refused).",
    ],
)
def test_only_a_local_http_service_that_refuses_is_a_set_up_error(line: str) -> None:
    c = classify_by_rules(ExitEvidence(REPLICA, 1, log_tail=("step 40 loss 0.3", line)))
    assert c.rule != "local-service-down"


def test_a_preemption_word_inside_an_identifier_is_not_a_notice() -> None:
    """orbax's `reached_preemption_sync_point(step)` in a traceback names a function."""
    c = classify_by_rules(
        ExitEvidence(
            REPLICA,
            1,
            log_tail=(
                "step 40 loss 0.3",
                '  File "multihost.py", line 401, in reached_preemption',
                "    multihost_utils.reached_preemption_sync_point(step)",
                "ValueError: bad step",
            ),
        )
    )
    assert (c.failure_class, c.retryable) == (FailureClass.USER_ERROR, False)


def test_a_reason_that_ends_its_own_sentence_gets_one_full_stop() -> None:
    c = _classify(1, log_tail=("ORTE has lost communication with a remote daemon.",))
    assert c.message.endswith(
        "Termination reason: ORTE has lost communication with a remote daemon."
    )
