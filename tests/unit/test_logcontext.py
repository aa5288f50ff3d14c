"""What a log tail says around its error: phase, step, wrappers, collectives, crash causes.

The rules' reading alone (`classify_by_rules`): the learned model's second opinion on
the uncertain ones is tested in tests/unit/test_learned.py.
"""

from __future__ import annotations

import pytest

from trainguard.classify.classes import ExitEvidence, FailureClass
from trainguard.classify.exits import (
    classify_by_rules,
    failed_before_stop,
)
from trainguard.classify.logcontext import (
    Phase,
    child_signal,
    collective_mismatch,
    crash_cause,
    first_collectives,
    gpu_held_elsewhere,
    last_step,
    phase_of,
    root_exception_block,
    solo_work_before_timeout,
)
from trainguard.classify.logtail import clean


@pytest.mark.parametrize(
    ("line", "step"),
    [
        ("step 5 loss 0.1 rank 1", 5),
        ("Step 12/100 | loss=2.3", 12),
        ("global_step=300 lr=0.1 loss=1.0", 300),
        ("[Iteration 9/10] loss 0.5", 9),
        ("iter: 40, loss: 3.2", 40),
        ("{'loss': 0.3, 'epoch': 1.2}", None),  # progress, but no step in it
        ("Waiting for step 0 of rendezvous", None),
        ("NCCL INFO step 3", None),
    ],
)
def test_last_step(line: str, step: int | None) -> None:
    assert last_step(["start", line, "Traceback (most recent call last):"]) == step


@pytest.mark.parametrize(
    ("lines", "phase"),
    [
        ([" 59%|█████▊    | 1663/2840 [6:59:31<4:51:53, 14.88s/it]"], Phase.TRAINING),
        (["{'loss': 0.0605, 'grad_norm': 0.6, 'epoch': 23.42}"], Phase.TRAINING),
        (["Epoch [5][400/1284]    lr: 0.00800, eta: 1:54:10"], Phase.TRAINING),
        (["Map: 100%|██████████| 1000/1000 [00:01<00:00, 900.00 examples/s]"], Phase.UNKNOWN),
        (["NCCL INFO Bootstrap : Using eth0"], Phase.UNKNOWN),
        ([], Phase.UNKNOWN),
    ],
)
def test_phase_from_the_log(lines: list[str], phase: Phase) -> None:
    assert phase_of(lines) is phase


def test_what_the_master_knows_wins_over_the_text() -> None:
    assert phase_of([], progressed=True) is Phase.TRAINING
    assert phase_of(["step 3 loss 1.0"], progressed=False) is Phase.STARTUP


@pytest.mark.parametrize(
    ("lines", "sig"),
    [
        (["Root Cause (first observed failure):", "[0]:", "  exitcode  : -9 (pid: 12)"], "SIGKILL"),
        (["  traceback : Signal 11 (SIGSEGV) received by PID 6421"], "SIGSEGV"),
        (["failed (exitcode: -11) local_rank: 1 (pid: 750662) of binary"], "SIGSEGV"),
        (["failed (exitcode: 1) local_rank: 0 (pid: 7) of binary"], None),
        (["Segmentation fault (core dumped)"], "SIGSEGV"),
        (["/bin/sh: line 1:  1234 Killed   python train.py"], "SIGKILL"),
        ([" 20%|████      | 216/1063 [00:27<02:17,  6.17it/s]Killed"], "SIGKILL"),
        (["已杀死"], "SIGKILL"),
        (["Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)"], "SIGSEGV"),
        (["process 1 terminated with signal SIGKILL"], "SIGKILL"),
        (["rank2 (local rank: 2)exitcode: -9 (pid: 36071)error file: <N/A>"], "SIGKILL"),
        (["traceback : signal 9 (SIGKILL) received by PID 36071"], "SIGKILL"),
        (["[launch.py:315] exits with return code = 1"], None),
        (["all good"], None),
    ],
)
def test_child_signal(lines: list[str], sig: str | None) -> None:
    assert child_signal(lines) == sig


def test_torchruns_root_cause_wins_over_later_deaths() -> None:
    lines = [
        "Failures:",
        "[1]:",
        "  exitcode  : -15 (pid: 2)",
        "Root Cause (first observed failure):",
        "[0]:",
        "  exitcode  : -6 (pid: 1)",
    ]
    assert child_signal(lines) == "SIGABRT"


CHILD_THEN_WRAPPER = (
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "train.py", line 9, in <module>',
    "[rank1]: KeyError: 'lr'",
    "E0101 torch.distributed.elastic.multiprocessing.api: failed (exitcode: 1) local_rank: 1",
    "Traceback (most recent call last):",
    '  File "/usr/bin/torchrun", line 8, in <module>',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "============================================================",
    "train.py FAILED",
)


def test_the_root_exception_is_inside_the_launchers_wrapper() -> None:
    block = root_exception_block(CHILD_THEN_WRAPPER)
    assert block is not None and block[2][0] == "KeyError: 'lr'"
    c = classify_by_rules(ExitEvidence("worker-0", 1, log_tail=CHILD_THEN_WRAPPER))
    assert (c.failure_class, c.rule, c.retryable) == (FailureClass.USER_ERROR, "python-bug", False)


def test_a_wrapper_alone_is_what_there_is() -> None:
    block = root_exception_block(CHILD_THEN_WRAPPER[4:])
    assert block is not None and "ChildFailedError" in block[2][0]


@pytest.mark.parametrize(
    "prefixed",
    [
        "[rank3]: KeyError: 'x'",
        "11: [rank11]: KeyError: 'x'",
        "(RayTrainWorker pid=42, ip=10.0.0.1) KeyError: 'x'",
        "(pid=1926) KeyError: 'x'",
        "[1,25]<stderr>:KeyError: 'x'",
        "2024-08-23T22:22:51.874Z | [rank3]:KeyError: 'x'",
        "[trainer0|0]:KeyError: 'x'",
    ],
)
def test_launcher_and_shipper_prefixes_are_cleaned(prefixed: str) -> None:
    assert clean(prefixed) == "KeyError: 'x'"


def test_ranks_in_different_collectives_at_one_sequence_number_are_a_bug() -> None:
    lines = [
        "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1803, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1807825 milliseconds",
        "[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1803, "
        "OpType=ALLGATHER, Timeout(ms)=1800000) ran for 1807825 milliseconds",
    ]
    why = collective_mismatch(lines)
    assert why is not None and "ALLREDUCE and ALLGATHER" in why
    c = classify_by_rules(ExitEvidence("worker-0", -6, log_tail=tuple(lines), progressed=True))
    assert (c.rule, c.retryable) == ("collective-mismatch", False)


def test_different_sizes_at_one_sequence_number_are_a_bug() -> None:
    lines = [
        "WorkNCCL(SeqNum=9, OpType=_ALLGATHER_BASE, NumelIn=75264, NumelOut=602112, Timeout",
        "WorkNCCL(SeqNum=9, OpType=_ALLGATHER_BASE, NumelIn=2359296, NumelOut=18874368, Time",
    ]
    assert collective_mismatch(lines) == (
        "ranks sent different sizes at SeqNum 9 (75264 and 2359296)"
    )


def test_the_same_collective_everywhere_is_no_evidence_of_a_bug() -> None:
    line = "WorkNCCL(SeqNum=44, OpType=ALLREDUCE, NumelIn=68, NumelOut=68, Timeout(ms)=600000)"
    assert collective_mismatch([line, line]) is None
    assert not first_collectives([line])
    assert first_collectives([line.replace("SeqNum=44", "SeqNum=1")])


def test_a_timeout_in_the_first_collectives_is_retried_once() -> None:
    line = (
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600010 milliseconds"
    )
    c = classify_by_rules(ExitEvidence("worker-0", -6, log_tail=(line,)))
    assert c.retryable and c.uncertain
    assert any("first collectives" in n for n in c.notes)


@pytest.mark.parametrize(
    ("lines", "user_error"),
    [
        (
            ["Loss.cu:250: Assertion `t >= 0 && t < n_classes` failed."],
            True,
        ),
        (
            ["terminate called after throwing an instance of 'c10::Error'", "  what():  invalid"],
            True,
        ),
        (["free(): invalid pointer"], True),
        (["  what():  [Rank 7] Watchdog caught collective operation timeout"], False),
        ([], False),
    ],
)
def test_a_crash_with_a_cause_in_the_log_is_the_jobs(lines: list[str], user_error: bool) -> None:
    assert (crash_cause(lines) is not None) is user_error
    c = classify_by_rules(ExitEvidence("worker-0", -6, log_tail=(*lines, "Aborted (core dumped)")))
    assert c.retryable is not user_error


def test_a_cuda_oom_with_the_memory_held_by_another_process_is_retryable() -> None:
    held = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 216.00 MiB (GPU 0; "
        "7.92 GiB total capacity; 69.17 MiB already allocated; 24.56 MiB free; 86.00 MiB "
        "reserved in total by PyTorch)"
    )
    own = held.replace("86.00 MiB reserved", "7.50 GiB reserved")
    assert gpu_held_elsewhere([held]) is not None and gpu_held_elsewhere([own]) is None
    c = classify_by_rules(ExitEvidence("worker-0", 1, log_tail=(held,)))
    assert (c.failure_class, c.retryable) == (FailureClass.CAPACITY, True)
    c = classify_by_rules(ExitEvidence("worker-0", 1, log_tail=(own,)))
    assert (c.failure_class, c.retryable) == (FailureClass.DEVICE_OOM, False)


def test_a_cuda_kernel_failure_reads_by_phase() -> None:
    line = "RuntimeError: CUDA error: an illegal memory access was encountered"
    trained = classify_by_rules(ExitEvidence("w", 1, log_tail=("step 900 loss 1.2", line)))
    fresh = classify_by_rules(ExitEvidence("w", 1, log_tail=(line,)))
    assert (trained.retryable, trained.hardware, trained.phase) == (True, True, "training")
    assert (fresh.retryable, fresh.rule) == (False, "cuda-launch-failure-untrained")
    assert fresh.uncertain


def test_a_shell_killed_sigkill_is_read_as_the_oom_killer() -> None:
    c = classify_by_rules(ExitEvidence("w", 1, log_tail=("step 3 loss 1", "Killed")))
    assert (c.failure_class, c.retryable) == (FailureClass.HOST_OOM, False)
    # without the shell's word it is a kill from outside
    c = classify_by_rules(ExitEvidence("w", -9))
    assert (c.failure_class, c.retryable) == (FailureClass.PREEMPTION, True)


@pytest.mark.parametrize(
    ("code", "tail"),
    [
        (
            1,
            (
                "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated "
                "with signal SIGKILL",
            ),
        ),
        (-9, ("Root Cause (first observed failure):", "[0]:", "  exitcode  : -9 (pid: 12)")),
    ],
)
def test_a_child_sigkilled_under_a_launcher_is_read_as_the_oom_killer(
    code: int, tail: tuple[str, ...]
) -> None:
    """The launcher lived to report one child's SIGKILL: a kill of one process, as the OOM
    killer makes; a preemption or a lost node takes the launcher too."""
    c = classify_by_rules(ExitEvidence("w", code, log_tail=tail))
    assert (c.failure_class, c.retryable, c.rule) == (
        FailureClass.HOST_OOM,
        False,
        "child-killed-under-launcher",
    )
    assert c.confidence < 0.7  # the learned model may read the log as a second opinion


def test_a_peer_reset_defers_to_a_cause_elsewhere_in_the_tail() -> None:
    lines = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "NCCL WARN Net : Call to recv from 10.0.0.2<4312> failed : Connection reset by peer",
    )
    c = classify_by_rules(ExitEvidence("w", 1, log_tail=lines))
    assert c.failure_class is FailureClass.DEVICE_OOM


def test_a_timeout_right_after_a_save_is_retried_once() -> None:
    lines = (
        "step 900 loss 0.52",
        "Saving model checkpoint to out/checkpoint-900",
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=15126, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 ms",
    )
    assert solo_work_before_timeout(lines) == "Saving model checkpoint to out/checkpoint-900"
    c = classify_by_rules(ExitEvidence("w", 1, log_tail=lines))
    assert c.retryable and c.uncertain
    assert solo_work_before_timeout(lines[::2]) is None


@pytest.mark.parametrize(
    "before",
    [
        "Epoch 3: 100%|##########| 16/16 [00:25<00:00,  1.48s/it]",  # the epoch's end
        "     Class     Images     Labels      P      R  mAP@.5 mAP@.5:.95:  96%|####  | 85/89",
    ],
)
def test_a_timeout_right_after_an_epoch_ends_or_validation_runs_is_retried_once(
    before: str,
) -> None:
    """End-of-epoch work (a save, a validation table) that some ranks do alone."""
    lines = (
        before,
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=15037, "
        "OpType=_ALLGATHER_BASE, Timeout(ms)=600000) ran for 600055 milliseconds",
    )
    assert solo_work_before_timeout(lines) == before.strip()
    c = classify_by_rules(ExitEvidence("w", 1, log_tail=lines))
    assert c.retryable and c.uncertain
    mid_epoch = ("Epoch 3:  75%|#######   | 12/16 [00:20<00:06,  1.48s/it]", lines[1])
    assert solo_work_before_timeout(mid_epoch) is None


def test_a_stopped_replica_that_was_dying_of_its_own_error_says_so() -> None:
    bug = ("Traceback (most recent call last):", '  File "t.py", line 3', "KeyError: 'lr'")
    c = failed_before_stop(ExitEvidence("w", -15, stop_requested=True, log_tail=bug))
    assert c is not None and (c.rule, c.exit_code, c.retryable) == ("python-bug", 1, False)
    reset = ("Traceback (most recent call last):", "RuntimeError: Connection reset by peer")
    assert failed_before_stop(ExitEvidence("w", -15, stop_requested=True, log_tail=reset)) is None
    later = (*bug, *(f"step {i} loss 0.1" for i in range(20)))  # it went on after that
    assert failed_before_stop(ExitEvidence("w", -15, stop_requested=True, log_tail=later)) is None
    assert failed_before_stop(ExitEvidence("w", 1, log_tail=bug)) is None  # not stopped
    # A deep stack (the header far up), its last frame with code and caret lines, then
    # 12 lines of shutdown noise: the short test before the whole read still finds it.
    frames = [f'  File "m{i}.py", line {i}, in f{i}' for i in range(60)]
    deep = (
        *(f"step {i} loss 0.1" for i in range(100)),
        "Traceback (most recent call last):",
        *frames,
        "    lr = cfg['lr']",
        "         ~~~^^^^^^",
        "KeyError: 'lr'",
        *(f"[W shutdown noise {i}]" for i in range(12)),
    )
    c = failed_before_stop(ExitEvidence("w", -15, stop_requested=True, log_tail=deep))
    assert c is not None and c.rule == "python-bug"


def test_older_pytorch_oom_numbers_count_allocated_and_cached_as_its_own() -> None:
    # PyTorch < 1.4 says "cached" where later versions say "reserved in total by PyTorch"
    elsewhere = (
        "RuntimeError: CUDA out of memory. Tried to allocate 14.00 MiB (GPU 1; 15.78 GiB "
        "total capacity; 2.68 GiB already allocated; 53.75 MiB free; 77.13 MiB cached; "
        "0 bytes inactive)"
    )
    own = elsewhere.replace("2.68 GiB already", "15.60 GiB already")
    assert "another process had" in (gpu_held_elsewhere([elsewhere]) or "")
    assert gpu_held_elsewhere([own]) is None
    # large and free: fragmentation or one huge request, the job's own doing
    free = elsewhere.replace("53.75 MiB free", "12.00 GiB free")
    assert gpu_held_elsewhere([free]) is None


SRUN_TEARDOWN = (
    "torch.distributed.elastic.rendezvous.api.RendezvousClosedError",
    "srun: error: cdr2596: task 1: Exited with exit code 1",
    "srun: Terminating StepId=21941655.1",
    "slurmstepd: error: *** STEP 21941655.1 ON cdr2596 CANCELLED AT 2024-01-05T14:27:50 ***",
    "WARNING:torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting "
    "down workers",
)


def test_a_sigterm_from_sruns_teardown_is_not_a_preemption() -> None:
    """srun ends a step's other tasks when one exits 1; their launcher's 'Received 15 death
    signal' is that teardown (pytorch/pytorch#116974), and the cause is what came before."""
    c = classify_by_rules(ExitEvidence("worker-0", 1, log_tail=SRUN_TEARDOWN))
    assert c.failure_class is not FailureClass.PREEMPTION
    assert c.rule.startswith("rendezvous-failure")
    assert any("srun tore the step down" in n for n in c.notes)


def test_a_preemption_that_slurm_announces_stays_one_though_tasks_exit_1_after() -> None:
    """submitit's notice and Slurm's requeue come first; the tasks' exit 1 follows."""
    lines = (
        "submitit WARNING (2022-08-12 02:06:11,453) - Caught signal SIGUSR2 on n1: this job is "
        "preempted.",
        "slurmstepd: error: *** STEP 608.0 ON n1 CANCELLED AT 2022-08-12T02:06:12 DUE TO JOB "
        "REQUEUE ***",
        "srun: error: n1: tasks 2-3: Exited with exit code 1",
    )
    c = classify_by_rules(ExitEvidence("worker-0", 1, log_tail=lines))
    assert (c.failure_class, c.retryable) == (FailureClass.PREEMPTION, True)
    bare = classify_by_rules(ExitEvidence("worker-0", 1, log_tail=SRUN_TEARDOWN[1:]))
    assert bare.failure_class is not FailureClass.PREEMPTION  # a failed task, cause unknown
