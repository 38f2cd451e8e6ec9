"""Rank script for tests/core/test_core_faults.py (no TensorFlow):

    tfringrun -np N python tests/core/dead_peer_worker.py VICTIM

After a warm-up allreduce, rank VICTIM kills itself (SIGKILL) while the
others wait in a collective it never submits. Each survivor prints one line,
``RESULT <rank> <exception type> <code> <is HorovodInternalError> <cause> <failing rank> <message>``,
and another for a later collective, which must fail at once the same way.
"""
import os
import sys
import time

import numpy as np

import tfring.core as hvd

victim = int(sys.argv[1])
hvd.init()
hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="warm_up")
if hvd.rank() == victim:
    time.sleep(0.5)  # the others are in the collective by now
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


report("pending", lambda: hvd.allreduce(np.ones(8, np.float32), name="never_completes"))
report("later", lambda: hvd.allgather(np.ones((1, 2)), name="later"))
# Let every survivor hear of the victim before this one leaves (a survivor
# that exits at once would be a second dead peer).
time.sleep(1.0)
