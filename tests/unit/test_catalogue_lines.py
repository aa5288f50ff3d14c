"""What the catalogue (signatures.yaml) reads in lines from real logs: schedulers', clouds'
and services' own words, GPUs taken or unseen, Xid codes, hedges and local services. Exit
statuses and signals: tests/unit/test_classify.py."""

from __future__ import annotations

from typing import Any

import pytest

from trainguard.classify.classes import Classification, ExitEvidence, FailureClass
from trainguard.classify.exits import classify_by_rules, classify_exit
from trainguard.classify.learned import SURE

REPLICA = "worker-1"


def _classify(returncode: int | None, **kw: Any) -> Classification:
    return classify_exit(ExitEvidence(REPLICA, returncode, **kw))


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
    """orbax's frame `reached_preemption_sync_point(step)` names a function, not a notice."""
    line = "    multihost_utils.reached_preemption_sync_point(step)"
    c = classify_by_rules(ExitEvidence(REPLICA, 1, log_tail=("step 40 loss 0.3", line)))
    assert c.failure_class is not FailureClass.PREEMPTION
