"""An elastic training script for tests/tensorflow/test_elastic.py.

A tiny Keras model trained with a custom loop under hvd.elastic.run, on a
deterministic data schedule: at step s with n ranks, rank r trains on
batch(s, n, r) (see training_schedule below), so a single process can replay
the same steps (replay()) and compare weights.

Behaviour is set by the environment:
  ELASTIC_STEPS           total steps (default 30)
  ELASTIC_KILL            "worker:step,...": each listed worker SIGKILLs itself
                          before its allreduce of that step
  ELASTIC_STOP            "worker:step,...": each listed worker SIGSTOPs itself
                          there instead: alive to the driver, silent to its peers
  ELASTIC_KILL_STARTING   "worker:round,...": each listed worker SIGKILLs itself
                          once it has joined that round, while its peers start it
  ELASTIC_RAISE_WORKER    worker id that raises ValueError ...
  ELASTIC_RAISE_STEP      ... at this step
  ELASTIC_STEP_SLEEP      seconds to sleep in each step (lets a test act mid-run)
  ELASTIC_WAIT_SIZE       wait (checking for hosts) at this step ...
  ELASTIC_WAIT_SIZE_STEP  ... until the job has this many ranks

Lines printed (rank 0 unless said): RESET step size (every rank, after each
re-formation), LOSS step loss, SIZE step size, FINAL rank json(weights)
(every rank).
"""
import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

import tfring.tensorflow as hvd

BATCH = 4
FEATURES = 5
LR = 0.05


def data():
    rng = np.random.RandomState(7)
    x = rng.normal(size=(240, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, 1)).astype(np.float32)
    y = (x @ w + 0.1 * rng.normal(size=(240, 1))).astype(np.float32)
    return x, y


def batch_index(step, size, rank, n):
    """Rows of rank `rank`'s batch at `step` with `size` ranks."""
    start = ((step * size + rank) * BATCH) % n
    return np.arange(start, start + BATCH) % n


def build():
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(8, "tanh"),
                                 tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.SGD(LR, momentum=0.9)
    opt.build(model.trainable_variables)
    return model, opt


def gradients(model, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    return tape.gradient(loss, model.trainable_variables)


def make_train_step(model, opt):
    """The step every elastic worker here runs (this one, the chaos run's,
    benchmarks/elastic_memory_worker.py's): gradients averaged over the
    ranks, then applied."""
    @tf.function
    def train_step(xb, yb):
        grads = [hvd.allreduce(g, op=hvd.Average) for g in gradients(model, xb, yb)]
        opt.apply_gradients(zip(grads, model.trainable_variables))
    return train_step


def pay_first_error_cost(fn, *args):
    """Makes TensorFlow do now, for the ``tf.function`` `fn` (as called with
    `args`, already traced), what it otherwise does at the function's first
    error: when a call raises, its error message is interpolated from the
    function's GraphDebugInfo, and building that materialises the creation
    stack trace of every node of the function, which TensorFlow keeps (this
    train step: ~0.9 MB of malloc'd memory, measured; a second error, or
    the first of another function traced from the same code, ~10-30 KB). In an elastic worker the first error is
    its first lost peer, so that cost showed as growth after warm-up in the
    chaos run's memory check (issue 40). This is TensorFlow's own one-off,
    not tfring's: a harness that counts growth pays it in its warm-up.
    Returns False where this TensorFlow has no such attribute (nothing paid)."""
    atomic = getattr(fn.get_concrete_function(*args), "_inference_function", None)
    # Reading the property is what builds the traces TensorFlow then keeps.
    return getattr(atomic, "graph_debug_info", None) is not None


def replay(schedule):
    """Weights after training on `schedule`, a list of sizes per step, in one
    process: each step averages the gradients of every rank's batch."""
    model, opt = build()
    x, y = data()
    for step, size in enumerate(schedule):
        per_rank = [gradients(model, x[batch_index(step, size, r, len(x))],
                              y[batch_index(step, size, r, len(x))]) for r in range(size)]
        mean = [tf.add_n([g[i] for g in per_rank]) / size for i in range(len(per_rank[0]))]
        opt.apply_gradients(zip(mean, model.trainable_variables))
    return [v.numpy() for v in model.trainable_variables]


def die_while_starting(rounds):
    """Makes this worker SIGKILL itself between joining one of `rounds` and
    registering for its start-up: its peers are then starting a round
    without it."""
    from tfring.common import elastic
    join = elastic.join_round

    def join_then_die():
        info = join()
        if f"{os.environ.get('TFRING_ELASTIC_WORKER')}:{info['round']}" in rounds:
            print("DYING", info["round"], flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return info
    elastic.join_round = join_then_die


def main():
    if os.environ.get("ELASTIC_KILL_STARTING"):
        die_while_starting(os.environ["ELASTIC_KILL_STARTING"].split(","))
    hvd.init()
    steps = int(os.environ.get("ELASTIC_STEPS", "30"))
    wid = os.environ.get("TFRING_ELASTIC_WORKER")
    env = os.environ.get
    sleep = float(env("ELASTIC_STEP_SLEEP", "0"))
    model, opt = build()
    x, y = data()
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)
    state.register_reset_callbacks([lambda: print("RESET", state.step, hvd.size(), flush=True)])

    train_step = make_train_step(model, opt)

    @tf.function
    def sparse_mean():
        # Traced once, at the first size: its average must follow the size
        # the job has when it runs (each rank gives one row of ones).
        rows = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
        return tf.reduce_sum(hvd.allreduce(rows, op=hvd.Average, name="sparse.mean").values)

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            s, n, r = state.step, hvd.size(), hvd.rank()
            if f"{wid}:{s}" in env("ELASTIC_KILL", "").split(","):
                os.kill(os.getpid(), signal.SIGKILL)
            if f"{wid}:{s}" in env("ELASTIC_STOP", "").split(","):
                os.kill(os.getpid(), signal.SIGSTOP)
            if wid == env("ELASTIC_RAISE_WORKER") and s == int(env("ELASTIC_RAISE_STEP", "-1")):
                raise ValueError(f"bad batch at step {s}")
            if s == int(env("ELASTIC_WAIT_SIZE_STEP", "-1")):
                want = int(env("ELASTIC_WAIT_SIZE"))
                while hvd.size() < want:
                    time.sleep(0.2)
                    state.check_host_updates()
            idx = batch_index(s, n, r, len(x))
            train_step(tf.constant(x[idx]), tf.constant(y[idx]))
            total = float(sparse_mean())
            if abs(total - 2.0) > 1e-5:
                raise AssertionError(f"a sparse average at size {n} summed to {total}, not 2")
            if sleep:
                time.sleep(sleep)
            state.step += 1
            if r == 0:
                loss = float(tf.reduce_mean((model(x) - y) ** 2))
                print("LOSS", s, f"{loss:.6f}", flush=True)
                print("SIZE", s, n, flush=True)
            state.commit()

    train(state)
    weights = [v.numpy().ravel().tolist() for v in model.trainable_variables]
    print("FINAL", hvd.rank(), json.dumps(weights), flush=True)


if __name__ == "__main__":
    sys.exit(main())
