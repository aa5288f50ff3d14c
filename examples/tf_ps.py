"""A tiny asynchronous TensorFlow ParameterServerStrategy job (TF2, CPU), driven by TF_CONFIG.

Every task runs this same program; what it does depends on its TF_CONFIG task type:

- `ps`, `worker`: start a `tf.distribute.Server` for the cluster and serve until killed
  (they never exit on their own: the job is done when the chief exits 0). With
  --exit-when-done they exit 0 once the chief has finished: its last act is to write a
  marker file on every ps and worker (a remote `tf.io.write_file`, so no shared storage
  is needed). A chief that dies writes no marker: the others keep serving.
- `chief`: the coordinator. It creates a 289-parameter MLP on the ps, schedules --steps
  training steps over the workers with a `tf.distribute.coordinator.ClusterCoordinator`,
  prints `step N loss L t=<unix time>` as each step's result comes back, checkpoints every
  --ckpt-every steps to --ckpt-dir, resumes from the latest checkpoint when it (that is,
  the job) is started again, and exits 0 after the last step. A worker that dies is the
  coordinator's business: its in-flight steps are re-run on the other workers, and the
  coordinator takes the worker back when it comes back with the same address. A ps that
  dies is fatal (the chief exits non-zero): restart the whole job, it resumes from the
  checkpoint.
- `evaluator` (optional, not part of the cluster): evaluates each new checkpoint in
  --ckpt-dir and exits 0 once it has seen the last step.

    TF_CONFIG='{"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"],
                            "ps": ["127.0.0.1:2224"]},
                "task": {"type": "chief", "index": 0}, "rpc_layer": "grpc"}' \\
        python examples/tf_ps.py --steps 200 --ckpt-dir /tmp/ps-ck

Steps are at-least-once: a step whose worker died mid-way is run again elsewhere, and may
already have updated the variables (asynchronous training tolerates this).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
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
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument(
        "--ckpt-dir",
        default=os.environ.get("TRAINGUARD_CHECKPOINT_DIR", "tf-ps-ckpt"),
        help="the chief's checkpoint directory (default: $TRAINGUARD_CHECKPOINT_DIR)",
    )
    p.add_argument("--out", help="where the chief writes the final weights (.npz)")
    p.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        help="chief: seconds to wait between scheduling two steps (paces the run)",
    )
    p.add_argument(
        "--exit-when-done",
        action="store_true",
        help="ps/worker: exit 0 once the chief has finished the job",
    )
    p.add_argument(
        "--done-dir",
        default="/tmp",
        help="where the chief leaves the ps' and workers' done markers, on their hosts",
    )
    p.add_argument("--verbose", action="store_true", help="log TensorFlow's INFO lines")
    p.add_argument(
        "--eval-idle-timeout",
        type=float,
        default=600.0,
        help="evaluator: exit 0 after this many seconds without a new checkpoint",
    )
    return p.parse_args()


def _log(msg: str) -> None:
    print(f"{msg} t={time.time():.6f}", flush=True)


def _make_vars() -> dict[str, tf.Variable]:
    init = np.random.default_rng(0)

    def var(name: str, shape: tuple[int, ...], scale: float) -> tf.Variable:
        return tf.Variable((init.standard_normal(shape) * scale).astype(np.float32), name=name)

    return {
        "w1": var("w1", (IN, HIDDEN), 0.25),
        "b1": var("b1", (HIDDEN,), 0.0),
        "w2": var("w2", (HIDDEN, 1), 0.25),
        "b2": var("b2", (1,), 0.0),
    }


def _batch(step: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    seed = tf.stack([tf.cast(step, tf.int64), tf.constant(0, tf.int64)])
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


def _done_marker(done_dir: str, address: str) -> str:
    """Where the chief marks the job done for the task at this address (on that task's host)."""
    return os.path.join(done_dir, "tf_ps_done_" + address.replace(":", "_"))


def _exit_when_done(marker: str) -> None:
    while not os.path.exists(marker):
        time.sleep(0.5)
    os.remove(marker)
    _log("the chief has finished the job: exiting")
    os._exit(0)


def _serve(conf: dict, task_type: str, index: int, args: argparse.Namespace) -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # Not inter_op_parallelism_threads=1: with it, a ps or worker server fails every step
    # (UnavailableError "Socket closed" / "Connection refused" between worker and ps).
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=task_type,
        task_index=index,
        protocol=resolver.rpc_layer or "grpc",
        config=config,
        start=True,
    )
    marker = _done_marker(args.done_dir, conf["cluster"][task_type][index])
    if os.path.exists(marker):
        os.remove(marker)  # left by an earlier job on this address
    _log(f"{task_type}:{index}: serving on {server.target}")
    if args.exit_when_done:
        threading.Thread(target=_exit_when_done, args=(marker,), daemon=True).start()
    server.join()


def _evaluate(args: argparse.Namespace) -> None:
    v = _make_vars()
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(step=step, **v)
    x, y = _batch(tf.constant(10**9, tf.int64))  # a fixed held-out batch
    for path in tf.train.checkpoints_iterator(
        args.ckpt_dir, min_interval_secs=0.5, timeout=args.eval_idle_timeout
    ):
        try:
            ckpt.restore(path).expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError):
            continue  # the chief removed it meanwhile (it keeps the last 2)
        _log(f"eval step {int(step)} loss {float(_loss(v, x, y)):.6f}")
        if int(step) >= args.steps:
            return
    _log("evaluator: no new checkpoint for --eval-idle-timeout seconds, exiting")


def _mark_done(resolver: tf.distribute.cluster_resolver.ClusterResolver, done_dir: str) -> None:
    """Tell every ps and worker that the job is done (they may exit with --exit-when-done).

    One thread per task and at most 10 s in all: a write to a task that is down (or
    that the coordinator is still recovering) can block.
    """

    def mark(job: str, i: int, address: str) -> None:
        try:
            with tf.device(f"/job:{job}/replica:0/task:{i}/device:CPU:0"):
                tf.io.write_file(_done_marker(done_dir, address), "done")
        except tf.errors.OpError as e:
            _log(f"chief: could not mark {job}:{i} done: {type(e).__name__}")

    threads = [
        threading.Thread(target=mark, args=(job, i, address), daemon=True)
        for job in ("ps", "worker")
        for i, address in enumerate(resolver.cluster_spec().as_dict().get(job, []))
    ]
    for t in threads:
        t.start()
    deadline = time.time() + 10
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.time()))


def _coordinate(args: argparse.Namespace) -> None:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        v = _make_vars()
        step_var = tf.Variable(0, dtype=tf.int64, name="step")
    ckpt = tf.train.Checkpoint(step=step_var, **v)
    latest = tf.train.latest_checkpoint(args.ckpt_dir)
    if latest:
        ckpt.restore(latest).assert_consumed()
        _log(f"chief: resumed from step {int(step_var.numpy())} ({latest})")
    start = int(step_var.numpy())
    manager = tf.train.CheckpointManager(ckpt, args.ckpt_dir, max_to_keep=2)
    up = time.time() - _T0
    _log(f"chief: cluster up after {up:.2f}s, training steps {start + 1}..{args.steps}")

    @tf.function
    def train_step(step: tf.Tensor) -> tf.Tensor:
        def replica_fn(step: tf.Tensor) -> tf.Tensor:
            x, y = _batch(step)
            with tf.GradientTape() as tape:
                loss = _loss(v, x, y)
            names = sorted(v)
            grads = tape.gradient(loss, [v[n] for n in names])
            for n, g in zip(names, grads, strict=True):
                v[n].assign_sub(LR * g)
            return loss

        return strategy.run(replica_fn, args=(step,))

    step = start
    while step < args.steps:
        chunk = range(step + 1, min(step + args.ckpt_every, args.steps) + 1)
        results = []
        for s in chunk:
            results.append((s, coordinator.schedule(train_step, args=(tf.constant(s, tf.int64),))))
            if args.step_time:
                time.sleep(args.step_time)
        for s, rv in results:
            _log(f"step {s} loss {float(rv.fetch()):.6f}")
        coordinator.join()
        step = chunk[-1]
        step_var.assign(step)
        manager.save(checkpoint_number=step)

    digest = weights_digest(v)
    if args.out:
        tmp = f"{args.out}.tmp{os.getpid()}.npz"
        np.savez(tmp, **{n: t.numpy() for n, t in v.items()})
        os.replace(tmp, args.out)
    _log(f"final weights sha256 {digest}")
    _mark_done(resolver, args.done_dir)
    _log(f"chief: done after {time.time() - _T0:.1f}s")
    # Leave without running the ClusterCoordinator's destructor: while a worker is being
    # recovered, its failure handler holds a lock inside update_server_def, and the
    # destructor waits for that lock, so a normal exit can hang until the worker is back.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    args = _args()
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        sys.exit("tf_ps.py: TF_CONFIG is not set")
    conf = json.loads(raw)
    task_type = str(conf.get("task", {}).get("type", ""))
    index = int(conf.get("task", {}).get("index", 0))
    _log(f"{task_type}:{index}: tensorflow {tf.__version__} imported in {_IMPORT_S:.2f}s")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if args.verbose:
        tf.get_logger().setLevel("INFO")
    if task_type in ("ps", "worker"):
        _serve(conf, task_type, index, args)
    elif task_type == "chief":
        _coordinate(args)
    elif task_type == "evaluator":
        _evaluate(args)
    else:
        sys.exit(f"tf_ps.py: unknown task type {task_type!r}")


if __name__ == "__main__":
    main()
