"""Rank script for tests/core/test_core_faults.py (no TensorFlow):

    tfringrun -np N python tests/core/dead_peer_worker.py VICTIM SIGNAL_DIR [kill|stop]

kill: after a warm-up allreduce, rank VICTIM kills itself (SIGKILL) once
every other rank has written SIGNAL_DIR/in_flight.<rank>: their core holds
the collective that the victim never submits.

stop: the ranks allreduce one tensor until the steady state runs it without
negotiation (speculation: straight into the data plane, shared memory on one
host), then VICTIM stops itself (SIGSTOP: alive but silent, as a frozen
process) and the others, once they see it stopped, run that allreduce once
more: they wait for the victim inside the data plane, not in a negotiation.
The lowest surviving rank kills the victim once every survivor has reported,
so the job ends.

Each survivor prints one line,
``RESULT <rank> <tag> <exception type> <code> <is HorovodInternalError> <cause> <failing rank> <message>``,
for the pending collective and for a later one, which must fail at once the
same way.
"""
import os
import signal
import sys
import time

import numpy as np

import tfring.core as hvd

from tfring.core import _module

victim, signal_dir = int(sys.argv[1]), sys.argv[2]
how = sys.argv[3] if len(sys.argv) > 3 else "kill"
hvd.init()
hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="warm_up")
survivors = [r for r in range(hvd.size()) if r != victim]
VICTIM_PID = os.path.join(signal_dir, "victim.pid")


def signal_path(name, rank):
    return os.path.join(signal_dir, f"{name}.{rank}")


def wait_until(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"rank {hvd.rank()}: gave up waiting after {seconds} s")
        time.sleep(0.01)


def victim_stopped():
    """Whether the victim's process is stopped (state T in /proc: it shares
    this host)."""
    try:
        with open(VICTIM_PID) as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (OSError, ValueError):
        return False
    return stat[stat.rfind(")") + 2] == "T"


def report(tag, call):
    try:
        call()
    except hvd.CoreError as e:
        line = " ".join(str(e).split())
        print("RESULT", hvd.rank(), tag, type(e).__name__, e.code,
              isinstance(e, hvd.HorovodInternalError), e.cause, e.rank, line, flush=True)
    else:
        print("RESULT", hvd.rank(), tag, "NO_ERROR", flush=True)


def lose_the_victim():
    """Makes the victim go away as `how` says; returns, on a survivor, a call
    that waits for the collective the victim never joins."""
    if how == "stop":
        steady = np.ones(8, np.float32)
        for _ in range(20):
            hvd.allreduce_(steady, op=hvd.Sum, name="steady")
        entered = dict(_module.load().speculation_stats())["entered"]
        print("SPECULATING", hvd.rank(), int(entered > 0), flush=True)
        if hvd.rank() == victim:
            with open(VICTIM_PID + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(VICTIM_PID + ".tmp", VICTIM_PID)
            os.kill(os.getpid(), signal.SIGSTOP)
        wait_until(victim_stopped)
        return lambda: hvd.allreduce_(steady, op=hvd.Sum, name="steady")
    if hvd.rank() == victim:
        wait_until(lambda: all(os.path.exists(signal_path("in_flight", r)) for r in survivors))
        os.kill(os.getpid(), signal.SIGKILL)
    pending = hvd.allreduce_async(np.ones(8, np.float32), name="never_completes")
    # queued_collectives counts what this rank submitted and has not run: the
    # collective waits for the victim from here on.
    wait_until(lambda: _module.load().queued_collectives() > 0)
    open(signal_path("in_flight", hvd.rank()), "w").close()
    return lambda: hvd.synchronize(pending)


report("pending", lose_the_victim())
report("later", lambda: hvd.allgather(np.ones((1, 2)), name="later"))
# Every survivor has heard of the victim before any leaves (a survivor that
# exited at once would be a second dead peer for the others).
open(signal_path("reported", hvd.rank()), "w").close()
wait_until(lambda: all(os.path.exists(signal_path("reported", r)) for r in survivors))
if how == "stop" and hvd.rank() == min(survivors):
    with open(VICTIM_PID) as f:
        os.kill(int(f.read()), signal.SIGKILL)
