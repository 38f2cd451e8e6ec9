"""Rank script for tests/core/test_core_faults.py (no TensorFlow):

    tfringrun -np N python tests/core/dead_peer_worker.py VICTIM SIGNAL_DIR

After a warm-up allreduce, rank VICTIM kills itself (SIGKILL) once every
other rank has written SIGNAL_DIR/in_flight.<rank>: their core holds the
collective that the victim never submits. Each survivor prints one line,
``RESULT <rank> <exception type> <code> <is HorovodInternalError> <cause> <failing rank> <message>``,
and another for a later collective, which must fail at once the same way.
"""
import os
import sys
import time

import numpy as np

import tfring.core as hvd

from tfring.core import _module

victim, signal_dir = int(sys.argv[1]), sys.argv[2]
hvd.init()
hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="warm_up")
survivors = [r for r in range(hvd.size()) if r != victim]


def signal_path(rank):
    return os.path.join(signal_dir, f"in_flight.{rank}")


def wait_until(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"rank {hvd.rank()}: gave up waiting after {seconds} s")
        time.sleep(0.01)


if hvd.rank() == victim:
    wait_until(lambda: all(os.path.exists(signal_path(r)) for r in survivors))
    os.kill(os.getpid(), 9)


def report(tag, call):
    try:
        call()
    except hvd.CoreError as e:
        line = " ".join(str(e).split())
        print("RESULT", hvd.rank(), tag, type(e).__name__, e.code,
              isinstance(e, hvd.HorovodInternalError), e.cause, e.rank, line, flush=True)
    else:
        print("RESULT", hvd.rank(), tag, "NO_ERROR", flush=True)


pending = hvd.allreduce_async(np.ones(8, np.float32), name="never_completes")
# queued_collectives counts what this rank submitted and has not run: the
# collective waits for the victim from here on.
wait_until(lambda: _module.load().queued_collectives() > 0)
open(signal_path(hvd.rank()), "w").close()
report("pending", lambda: hvd.synchronize(pending))
report("later", lambda: hvd.allgather(np.ones((1, 2)), name="later"))
# Every survivor has heard of the victim before any leaves (a survivor that
# exited at once would be a second dead peer for the others).
open(os.path.join(signal_dir, f"reported.{hvd.rank()}"), "w").close()
wait_until(lambda: all(os.path.exists(os.path.join(signal_dir, f"reported.{r}"))
                       for r in survivors))
