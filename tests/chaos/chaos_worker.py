"""The worker of the chaos run (tests/chaos/chaos.py).

Elastic Keras training under ``hvd.elastic.run`` on the deterministic
schedule of tests/tensorflow/elastic_worker.py (at step s with n ranks, rank r
trains on batch(s, n, r)), so that the driver can replay the steps at the
sizes they ran at and check the loss. It trains until the driver creates
the file named by CHAOS_STOP_FILE; the ranks agree on the step to stop at
through an allreduce, so that they all end on the same weights.

Lines printed:
  LOSS step loss          rank 0, after each step: the loss on all the data
  SIZE step size          rank 0, after each step
  DIGEST step size sha    every rank, every CHAOS_DIGEST_EVERY steps: a hash
                          of its weights (the ranks of a step must agree)
  FINAL rank sha          every rank, at the end
"""
import hashlib
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tensorflow"))
import elastic_worker  # noqa: E402
import memory_detail  # noqa: E402

import tfring.tensorflow as hvd  # noqa: E402


def digest(model):
    h = hashlib.sha1()
    for v in model.trainable_variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()[:16]


def main():
    # The driver's leftover check looks for the shared-memory segments of
    # the run's workers, named by their pids.
    with open(os.environ["CHAOS_PIDS_FILE"], "a") as f:
        f.write(f"{os.getpid()}\n")
    hvd.init()
    stop_file = os.environ["CHAOS_STOP_FILE"]
    every = int(os.environ.get("CHAOS_DIGEST_EVERY", "10"))
    sleep = float(os.environ.get("CHAOS_STEP_SLEEP", "0.05"))
    model, opt = elastic_worker.build()
    x, y = elastic_worker.data()
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)

    train_step = elastic_worker.make_train_step(model, opt)
    # A breakdown of this worker's memory after each step, only when the
    # run asks for it (benchmarks/chaos.py --memory-detail).
    memory = memory_detail.recorder()
    paid = []

    @hvd.elastic.run
    def train(state):
        while True:
            s, n, r = state.step, hvd.size(), hvd.rank()
            idx = elastic_worker.batch_index(s, n, r, len(x))
            xb, yb = tf.constant(x[idx]), tf.constant(y[idx])
            train_step(xb, yb)
            if not paid:
                # TensorFlow's one-off of the step's first error (~0.9 MB,
                # see pay_first_error_cost), paid here in the warm-up instead
                # of at the worker's first lost peer, where the run's memory
                # check counted it as growth.
                paid.append(elastic_worker.pay_first_error_cost(train_step, xb, yb))
            # Every rank computes the loss, rank 0 prints it: work that only
            # rank 0 did cost a worker memory the first time it became rank 0
            # (TensorFlow's first eager pass of the model: +428 KB measured
            # alone), which the run's memory check counted as growth.
            loss = float(tf.reduce_mean((model(x) - y) ** 2))
            if r == 0:
                print("LOSS", s, f"{loss:.7g}", flush=True)
                print("SIZE", s, n, flush=True)
            if s % every == 0:
                print("DIGEST", s, n, digest(model), flush=True)
            # Every rank says whether it saw the stop file; the largest
            # answer is everyone's, so they all stop after the same step.
            seen = tf.constant([float(os.path.exists(stop_file))])
            stop = float(hvd.allreduce(seen, op=hvd.Max, name="chaos.stop")[0]) > 0
            state.step += 1
            state.commit()
            if memory is not None:
                memory.record(s)
            if stop:
                return
            time.sleep(sleep)

    train(state)
    print("FINAL", hvd.rank(), digest(model), flush=True)


if __name__ == "__main__":
    sys.exit(main())
