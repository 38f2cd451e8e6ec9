"""Rank script for test_cross_host.py: runs inside a fake host.

    tfringrun --tcp -H h0:1,h1:1 python cross_host_worker.py SCENARIO DIR

Scenarios:
  ring     allreduce/allgather/broadcast across the hosts; prints RESULT ok
           with the topology and the data plane that ran.
  kill     after a warm-up every rank records its pid; the others write
           DIR/entering.RANK and enter an allreduce that needs the last rank,
           which SIGKILLs itself once every one of those files exists.
  cut      after a warm-up every rank writes DIR/ready.RANK and then runs
           64 MB allreduces back to back until one fails; the test cuts the
           last host off the network while they run.
Survivors print RESULT aborted <time.time() of the error> <message>; the
victim of "kill" writes the time.time() of its death into DIR/killed_at.
"""
import os
import signal
import socket
import sys
import time

import tensorflow as tf

import tfring.tensorflow as hvd

SCENARIO, DIR = sys.argv[1], sys.argv[2]


def say(*words):
    print("RESULT", hvd.rank(), *words, flush=True)


def main():
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    x = tf.fill([1 << 18], float(rank + 1))
    total = hvd.allreduce(x, op=hvd.Sum, name="warm_up").numpy()
    assert (total == size * (size + 1) / 2).all(), total[:4]
    if SCENARIO == "ring":
        gathered = hvd.allgather(tf.fill([rank + 1, 2], rank), name="gather").numpy()
        expect = [r for r in range(size) for _ in range(r + 1)]
        assert list(gathered[:, 0]) == expect, gathered
        b = hvd.broadcast(tf.fill([1000], rank + 7), root_rank=size - 1, name="bcast").numpy()
        assert (b == size - 1 + 7).all()
        say("ok", f"host={socket.gethostname()}", f"local_size={hvd.local_size()}",
            f"cross_size={hvd.cross_size()}", f"gloo={hvd.gloo_enabled()}",
            f"mpi={hvd.mpi_enabled()}", f"mpi4py_loaded={'mpi4py' in sys.modules}")
        hvd.shutdown()
        return
    with open(os.path.join(DIR, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    victim = size - 1
    if SCENARIO == "kill" and rank == victim:
        # The others are at their allreduce (or about to enter it: it fails
        # all the same, from the moment of the death).
        wait_for_files([f"entering.{r}" for r in range(size - 1)])
        with open(os.path.join(DIR, "killed_at"), "w") as f:
            f.write(f"{time.time():.3f}")
        os.kill(os.getpid(), signal.SIGKILL)
    touch("entering" if SCENARIO == "kill" else "ready", rank)
    try:
        if SCENARIO == "cut":
            big = tf.ones([16 << 20])  # 64 MB of float32
            deadline = time.time() + 300
            while time.time() < deadline:  # until the cut breaks one
                hvd.allreduce(big, op=hvd.Sum, name="big").numpy()
        else:
            hvd.allreduce(tf.ones([1 << 16]), op=hvd.Sum, name="needs_everyone").numpy()
        say("completed")
    except tf.errors.AbortedError as e:
        say("aborted", f"{time.time():.3f}", " ".join(str(e).split()))
    sys.stdout.flush()
    os._exit(1)


def touch(what, rank):
    with open(os.path.join(DIR, f"{what}.{rank}.tmp"), "w"):
        pass
    os.replace(os.path.join(DIR, f"{what}.{rank}.tmp"), os.path.join(DIR, f"{what}.{rank}"))


def wait_for_files(names, timeout=120):
    deadline = time.time() + timeout
    while not all(os.path.exists(os.path.join(DIR, n)) for n in names):
        if time.time() > deadline:
            raise TimeoutError(f"no {names} in {DIR} after {timeout} s")
        time.sleep(0.01)


main()
