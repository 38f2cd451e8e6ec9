"""The worker of benchmarks/elastic_memory.py: elastic TensorFlow training
that reports its own resident memory around every reset.

Modes (ELASTIC_MEMORY_MODE):
  keras   the chaos run's worker (tests/chaos/chaos_worker.py): a Keras
          model, a ``tf.function`` train step with an allreduce per
          gradient, TensorFlowKerasState, the loss on all the data eagerly
  object  no model and no ``tf.function``: ObjectState and one eager
          allreduce per step; what a reset costs with the least TensorFlow

Lines printed (stdout):
  PID pid                    at start (the harness kills workers by it)
  MEM event reset step size rss_kb heap_kb mmap_kb py_kb objects
      event is "reset" (after each re-formation, state synced) or "steps"
      (every ELASTIC_MEMORY_EVERY steps); heap_kb and mmap_kb are glibc's
      bytes in use (mallinfo2: uordblks, hblkhd), py_kb what tracemalloc
      traces (0 unless ELASTIC_MEMORY_TRACE=1), objects gc's object count
  GCDIFF reset type:+n ...   with ELASTIC_MEMORY_TRACE=1: the object types
      that grew most since the previous reset
  TRACE ...                  with ELASTIC_MEMORY_TRACE=1, at the end: the
      lines whose traced memory grew most since the second reset
"""
import collections
import ctypes
import gc
import os
import sys
import time
import tracemalloc

import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "tensorflow"))
import elastic_worker  # noqa: E402

import tfring.tensorflow as hvd  # noqa: E402

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo():
    """(bytes in use on malloc's heaps, bytes in its mmapped blocks), or
    (0, 0) without glibc's mallinfo2."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return 0, 0
    fn.restype = _MallInfo2
    info = fn()
    return info.uordblks, info.hblkhd


def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE // 1024


class Probe:
    """Prints MEM lines; with tracing on, also where Python memory grew."""

    def __init__(self, trace):
        self.trace = trace
        self.resets = 0
        self.types = None
        self.first_snapshot = None

    def sample(self, event, step):
        heap, mmapped = _mallinfo()
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        objects = len(gc.get_objects())
        print("MEM", event, self.resets, step, hvd.size(), rss_kb(), heap // 1024,
              mmapped // 1024, traced // 1024, objects, flush=True)

    def on_reset(self, step):
        self.resets += 1
        if self.trace:
            gc.collect()
            types = collections.Counter(type(o).__name__ for o in gc.get_objects())
            if self.types is not None:
                grew = sorted(((n - self.types.get(t, 0), t) for t, n in types.items()
                               if n > self.types.get(t, 0)), reverse=True)[:12]
                print("GCDIFF", self.resets, " ".join(f"{t}:+{n}" for n, t in grew), flush=True)
            self.types = types
            if self.resets == 1:
                tracemalloc.start(8)
            elif self.resets == 2:
                self.first_snapshot = tracemalloc.take_snapshot()
        self.sample("reset", step)

    def report(self):
        if self.first_snapshot is None:
            return
        gc.collect()
        stats = tracemalloc.take_snapshot().compare_to(self.first_snapshot, "traceback")
        for stat in stats[:15]:
            if stat.size_diff <= 0:
                break
            where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                                for f in stat.traceback[:6])
            print("TRACE", f"{stat.size_diff / 1024:+.1f}KB", f"{stat.count_diff:+d}", where,
                  flush=True)


def main():
    print("PID", os.getpid(), flush=True)
    hvd.init()
    mode = os.environ.get("ELASTIC_MEMORY_MODE", "keras")
    stop_file = os.environ["ELASTIC_MEMORY_STOP"]
    every = int(os.environ.get("ELASTIC_MEMORY_EVERY", "25"))
    sleep = float(os.environ.get("ELASTIC_MEMORY_SLEEP", "0.02"))
    probe = Probe(os.environ.get("ELASTIC_MEMORY_TRACE") == "1")

    if mode == "keras":
        model, opt = elastic_worker.build()
        x, y = elastic_worker.data()
        state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)

        train_step = elastic_worker.make_train_step(model, opt)

        def step(s, n, r):
            idx = elastic_worker.batch_index(s, n, r, len(x))
            train_step(tf.constant(x[idx]), tf.constant(y[idx]))
            if r == 0:
                float(tf.reduce_mean((model(x) - y) ** 2))
    elif mode == "object":
        state = hvd.elastic.ObjectState(step=0)
        ones = np.ones(16, np.float32)

        def step(s, n, r):
            hvd.allreduce(tf.constant(ones), op=hvd.Sum, name="memory.step")
    else:
        raise ValueError(f"ELASTIC_MEMORY_MODE={mode!r}: use keras or object")
    state.register_reset_callbacks([lambda: probe.on_reset(state.step)])

    @hvd.elastic.run
    def train(state):
        while True:
            step(state.step, hvd.size(), hvd.rank())
            seen = tf.constant([float(os.path.exists(stop_file))])
            stop = float(hvd.allreduce(seen, op=hvd.Max, name="memory.stop")[0]) > 0
            state.step += 1
            if state.step % every == 0:
                probe.sample("steps", state.step)
            state.commit()
            if stop:
                return
            time.sleep(sleep)

    probe.sample("start", 0)
    train(state)
    probe.report()
    print("DONE", hvd.rank(), flush=True)


if __name__ == "__main__":
    sys.exit(main())
