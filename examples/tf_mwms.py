"""A tiny synchronous TensorFlow MultiWorkerMirroredStrategy job (CPU), driven by TF_CONFIG.

Every task of the cluster (an optional `chief` and the `worker`s; no `ps`) runs this same
program. It trains a 289-parameter MLP with a custom loop (no Keras), prints one line per
step, checkpoints every --ckpt-every steps and resumes from the latest checkpoint when it
is started again. Data are derived from (step, task), so a job that is killed, restarted
as a whole and resumed ends with exactly the weights of one that never was.

Checkpoints: every task saves (MultiWorkerMirroredStrategy wants all of them to), the
chief into --ckpt-dir, the others into a temporary directory they delete at once. Every
task restores from --ckpt-dir (a directory all tasks see: the same host, or shared
storage).

An `evaluator` task (TF_CONFIG task type "evaluator", not part of the cluster) does not
train: it evaluates each new checkpoint in --ckpt-dir and exits 0 once it has seen the
last step (or after --eval-idle-timeout seconds without a new checkpoint).

    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]},
                "task": {"type": "worker", "index": 0}}' \\
        python examples/tf_mwms.py --steps 50 --ckpt-dir /tmp/mwms-ck

Each step prints `step 12 loss 0.123456 task worker:0 t=<unix time>`; the chief ends with
`final weights sha256 <hex>` (and writes them to --out as .npz).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

_T0 = time.time()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_IMPORT_S = time.time() - _T0

BATCH = 64
IN, HIDDEN = 16, 16
LR = 0.05


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument(
        "--ckpt-dir",
        default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "tf-mwms-ckpt"),
        help="the chief's checkpoint directory (default: $TRAINGUARD_CHECKPOINT_DIR)",
    )
    p.add_argument("--out", help="where the chief writes the final weights (.npz)")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    p.add_argument(
        "--crash-at-step",
        type=int,
        help="demo fault: on the first attempt only ($TRAINGUARD_RESTART_COUNT unset or 0) "
        "the task --crash-task SIGKILLs itself after this step",
    )
    p.add_argument("--crash-task", default="worker:1", help="TYPE:INDEX, e.g. worker:1")
    p.add_argument(
        "--eval-idle-timeout",
        type=float,
        default=600.0,
        help="evaluator: exit 0 after this many seconds without a new checkpoint",
    )
    return p.parse_args()


def _tf_config() -> tuple[dict, str, int]:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        sys.exit("tf_mwms.py: TF_CONFIG is not set")
    conf = json.loads(raw)
    task = conf.get("task", {})
    return conf, str(task.get("type", "worker")), int(task.get("index", 0))


def _rank(cluster: dict, task_type: str, index: int) -> tuple[int, bool]:
    """This task's place among the training tasks (chief first) and whether it is chief."""
    has_chief = bool(cluster.get("chief"))
    if task_type == "chief":
        return 0, True
    return index + (1 if has_chief else 0), (not has_chief and index == 0)


def _make_vars() -> dict[str, tf.Variable]:
    init = np.random.default_rng(0)

    def var(name: str, shape: tuple[int, ...], scale: float) -> tf.Variable:
        value = (init.standard_normal(shape) * scale).astype(np.float32)
        return tf.Variable(value, name=name, aggregation=tf.VariableAggregation.MEAN)

    return {
        "w1": var("w1", (IN, HIDDEN), 0.25),
        "b1": var("b1", (HIDDEN,), 0.0),
        "w2": var("w2", (HIDDEN, 1), 0.25),
        "b2": var("b2", (1,), 0.0),
    }


def _batch(step: tf.Tensor, rank: int) -> tuple[tf.Tensor, tf.Tensor]:
    seed = tf.stack([tf.cast(step, tf.int64), tf.constant(rank, tf.int64)])
    x = tf.random.stateless_normal([BATCH, IN], seed=seed)
    y = tf.sin(0.25 * tf.reduce_sum(x, axis=1, keepdims=True))
    return x, y


def _loss(v: dict[str, tf.Variable], x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    h = tf.tanh(tf.matmul(x, v["w1"]) + v["b1"])
    return tf.reduce_mean(tf.square(tf.matmul(h, v["w2"]) + v["b2"] - y))


def weights_digest(v: dict[str, tf.Variable]) -> str:
    h = hashlib.sha256()
    for name in sorted(v):
        h.update(name.encode())
        h.update(np.ascontiguousarray(v[name].numpy()).tobytes())
    return h.hexdigest()


def _evaluate(args: argparse.Namespace) -> None:
    """The evaluator: evaluate every new checkpoint until the last step has been seen."""
    v = _make_vars()
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step, **v)
    x, y = _batch(tf.constant(10**9, tf.int64), 0)  # a fixed held-out batch
    for path in tf.train.checkpoints_iterator(
        args.ckpt_dir, min_interval_secs=0.5, timeout=args.eval_idle_timeout
    ):
        try:
            ckpt.restore(path).expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError):
            continue  # the chief removed it meanwhile (it keeps the last 2)
        loss = float(_loss(v, x, y))
        print(f"eval step {int(step)} loss {loss:.6f} t={time.time():.6f}", flush=True)
        if int(step) >= args.steps:
            return
    print("evaluator: no new checkpoint for --eval-idle-timeout seconds, exiting", flush=True)


def main() -> None:
    args = _args()
    conf, task_type, index = _tf_config()
    me = f"{task_type}:{index}"
    print(f"{me}: tensorflow {tf.__version__} imported in {_IMPORT_S:.2f}s", flush=True)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if task_type == "evaluator":
        _evaluate(args)
        return
    if task_type not in ("chief", "worker"):
        sys.exit(f"tf_mwms.py: task type {task_type!r} has no part in MultiWorkerMirroredStrategy")

    rank, is_chief = _rank(conf.get("cluster", {}), task_type, index)
    restart = int(os.environ.get("TRAINGUARD_RESTART_COUNT", "0") or 0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING
        )
    )
    with strategy.scope():
        v = _make_vars()
    step_var = tf.Variable(0, dtype=tf.int64)  # not distributed: every task keeps its own
    ckpt = tf.train.Checkpoint(step=step_var, **v)

    latest = tf.train.latest_checkpoint(args.ckpt_dir)
    if latest:
        ckpt.restore(latest).assert_consumed()
        print(f"{me}: resumed from step {int(step_var)} ({latest})", flush=True)
    start = int(step_var)

    @tf.function
    def train_step(step: tf.Tensor) -> tf.Tensor:
        def replica_fn(step: tf.Tensor) -> tf.Tensor:
            x, y = _batch(step, rank)
            with tf.GradientTape() as tape:
                loss = _loss(v, x, y)
            names = sorted(v)
            grads = tape.gradient(loss, [v[n] for n in names])
            for n, g in zip(names, grads, strict=True):
                v[n].assign_sub(LR * g)  # MEAN aggregation: the update is all-reduced
            return loss

        per_replica = strategy.run(replica_fn, args=(step,))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)

    def save(step: int) -> None:
        step_var.assign(step)
        if is_chief:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            tf.train.CheckpointManager(ckpt, args.ckpt_dir, max_to_keep=2).save(
                checkpoint_number=step
            )
        else:
            tmp = tempfile.mkdtemp(prefix=f"tf-mwms-{task_type}{index}-")
            try:
                tf.train.CheckpointManager(ckpt, tmp, max_to_keep=1).save(checkpoint_number=step)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    for step in range(start + 1, args.steps + 1):
        loss = float(train_step(tf.constant(step, tf.int64)))
        print(f"step {step} loss {loss:.6f} task {me} t={time.time():.6f}", flush=True)
        if step == args.crash_at_step and me == args.crash_task and restart == 0:
            print(f"injected fault: {me} SIGKILLs itself t={time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if step % args.ckpt_every == 0 or step == args.steps:
            save(step)
        if args.step_time:
            time.sleep(args.step_time)

    if is_chief:
        digest = weights_digest(v)
        if args.out:
            tmp = f"{args.out}.tmp{os.getpid()}.npz"
            np.savez(tmp, **{n: t.numpy() for n, t in v.items()})
            os.replace(tmp, args.out)
        print(f"final weights sha256 {digest}", flush=True)
    print(f"{me}: done after {time.time() - _T0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
