"""Rank script for tests/common/test_faults.py: one scenario per run.

    tfringrun -np N python tests/common/fault_worker.py SCENARIO DIR [ARGS...]

Every rank first records its pid and its parent's (its wrapper's, or a
shell's when the rank command is a script) in DIR/pids.RANK and the
parent's name in DIR/parent.RANK, and after init() the /dev/shm files it
has mapped in DIR/shm.RANK, so the test can check afterwards that none of
them outlived the job. Results are printed
as single lines the test parses (RESULT ...).

The faults are the core's and the launcher's, so the scenarios run on
tfring.core with numpy arrays (a rank starts in a fraction of a second);
FAULT_FRAMEWORK=tf runs them through tfring.tensorflow instead, for what the
TF binding adds (its error types, a step compiled with XLA, its kernels'
completion on shutdown). Both raise the same error types: an AbortedError
that is a HorovodInternalError, and a precondition error.
"""
import os
import sys
import threading
import time

# The launcher's numbering: MPI's under mpiexec, tfringrun's own under --tcp.
RANK = int(os.environ.get("TFRING_RANK", os.environ.get("PMI_RANK", "0")))
SCENARIO, DIR = sys.argv[1], sys.argv[2]
ARGS = sys.argv[3:]


def _write(name, text):
    path = os.path.join(DIR, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def _wait_for(names, seconds=20.0):
    """Waits until every file of `names` exists in DIR (written by other ranks)."""
    deadline = time.time() + seconds
    while time.time() < deadline and not all(os.path.exists(os.path.join(DIR, n)) for n in names):
        time.sleep(0.02)


def _wait_until_queued(seconds=20.0):
    """Waits until this rank's core holds a collective it submitted (on
    another thread) that has not run: the collective is in flight."""
    deadline = time.time() + seconds
    while basics._queued_collectives() == 0 and time.time() < deadline:
        time.sleep(0.01)


def _report_queued(name):
    """Writes DIR/NAME once this rank's next collective is in flight, from
    a thread, so the test signals only then."""
    def watch():
        _wait_until_queued()
        _write(name, "1")
    threading.Thread(target=watch, daemon=True).start()


def say(*words):
    print("RESULT", RANK, *words, flush=True)


_write(f"pids.{RANK}", f"{os.getpid()} {os.getppid()}")
with open(f"/proc/{os.getppid()}/comm") as _f:
    _write(f"parent.{RANK}", _f.read().strip())

import numpy as np  # noqa: E402

FRAMEWORK = os.environ.get("FAULT_FRAMEWORK") or "core"
if FRAMEWORK == "tf":
    import tensorflow as tf

    import tfring.tensorflow as hvd
    from tfring.common import basics
    Aborted, Precondition = tf.errors.AbortedError, tf.errors.FailedPreconditionError

    def ones(n):
        return tf.ones([n])
else:
    import tfring.core as hvd
    Aborted, Precondition = hvd.AbortedError, hvd.PreconditionError

    def ones(n):
        return np.ones(n, np.float32)


def allreduce_reporting_queued(x, name, flag):
    """hvd.allreduce(x, Sum) that writes DIR/FLAG once the collective is in
    flight on this rank: tfring.core's async call has enqueued it when it
    returns; TF's kernel enqueues it on another thread, which a watcher sees."""
    if FRAMEWORK == "tf":
        _report_queued(flag)
        return hvd.allreduce(x, op=hvd.Sum, name=name)
    handle = hvd.allreduce_async(x, op=hvd.Sum, name=name)
    _write(flag, "1")
    return hvd.synchronize(handle)


def start():
    hvd.init()
    # Every rank has joined MPI's shared memory once a collective has run.
    hvd.allreduce(ones(4), op=hvd.Sum, name="warm_up")
    mapped = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/dev/shm/") and "(deleted)" not in line:
                mapped.add(fields[5])
    _write(f"shm.{hvd.rank()}", "".join(p + "\n" for p in sorted(mapped)))


def one_line(message):
    return " ".join(message.split())


def say_failure(kind, error):
    """RESULT KIND_CAUSE CAUSE RANK TYPES: the failure's cause and rank, and
    which of the types Horovod users catch it is."""
    from tfring.common.exceptions import HorovodInternalError
    types = [name for name, cls in (("aborted", Aborted), ("precondition", Precondition),
                                    ("internal", HorovodInternalError)) if isinstance(error, cls)]
    say(f"{kind}_CAUSE", getattr(error, "cause", "none"), getattr(error, "rank", "none"),
        ",".join(types))


def _dead_rank_collective():
    """The collective the survivors wait in: an eager allreduce, or with
    FAULT_XLA=1 the same inside a step compiled with XLA (compiled here, on
    every rank, before anyone dies; its errors typed as the eager call's
    are, from the payload the compiled step carries)."""
    if os.environ.get("FAULT_XLA") != "1":
        return lambda x, name: hvd.allreduce(x, name=name)
    assert FRAMEWORK == "tf", "FAULT_XLA=1 needs FAULT_FRAMEWORK=tf"
    from tfring.common import tf_errors
    step = tf.function(lambda x: hvd.allreduce(x, name="never_completes"), jit_compile=True)
    step(tf.ones([8]))

    def compiled(x, name):  # one compiled step: its collective keeps its name
        try:
            return step(x)
        except tf.errors.OpError as e:
            raise tf_errors.typed(e) from None
    return compiled


def dead_rank():
    """ARGS: HOW VICTIM. The victim dies (kill: SIGKILL, exit: os._exit(3),
    raise: an uncaught ValueError) while the other ranks wait in a collective
    it never submits; they report how long it took them to hear of it."""
    how, victim = ARGS[0], int(ARGS[1])
    start()
    collective = _dead_rank_collective()
    survivors = [r for r in range(hvd.size()) if r != victim]
    if hvd.rank() == victim:
        # Dies once every survivor is about to submit (a survivor that
        # submits a moment after the death fails the same way: the detection
        # time counts from the death).
        _wait_for([f"waiting.{r}" for r in survivors])
        _write("death_time", repr(time.time()))
        if how == "kill":
            os.kill(os.getpid(), 9)
        elif how == "exit":
            os._exit(3)
        raise ValueError("the victim gave up")
    _write(f"waiting.{hvd.rank()}", "1")
    try:
        collective(ones(8), "never_completes")
    except Aborted as e:
        took = time.time() - float(open(os.path.join(DIR, "death_time")).read())
        say("DETECTED", f"{took:.3f}", one_line(e.message))
        say_failure("DETECTED", e)
    else:
        say("NO_ERROR")
        return
    # A later collective fails the same way, at once.
    begin = time.time()
    try:
        collective(ones(8), "later")
    except Aborted as e:
        say("LATER", f"{time.time() - begin:.3f}", one_line(e.message))
        say_failure("LATER", e)
    say("DONE")
    # Stay until every survivor has heard of the death. A survivor that exits
    # at once is a second dead peer, and a rank whose monitor looks later may
    # name it instead of the victim: the monitor reports the lowest dead rank,
    # not the first to die (FAULT_NO_WAIT=1 shows that).
    _write(f"done.{hvd.rank()}", "1")
    if os.environ.get("FAULT_NO_WAIT") != "1":
        _wait_for([f"done.{r}" for r in survivors], seconds=10)


def stall():
    """ARGS: WAIT. Rank 0 submits 'stalled_tensor' at once; the other ranks
    submit it after WAIT seconds, or earlier if the job stops (stall shutdown)."""
    wait = float(ARGS[0])
    start()
    begin = time.time()
    if hvd.rank() != 0:
        while hvd.is_initialized() and time.time() < begin + wait:
            time.sleep(0.05)
    try:
        if hvd.rank() == 0:
            out = allreduce_reporting_queued(ones(3), "stalled_tensor", "queued.0")
        else:
            out = hvd.allreduce(ones(3), op=hvd.Sum, name="stalled_tensor")
        say("COMPLETED", f"{time.time() - begin:.3f}", np.asarray(out)[0])
    except Aborted as e:
        say("ABORTED", f"{time.time() - begin:.3f}", one_line(e.message))
        say_failure("ABORTED", e)


def shutdown_pending():
    """Rank 0 starts a collective on a thread that rank 1 never submits, then
    calls shutdown(); the pending collective must fail, not hang. (TF only:
    it is about the TF kernels' completion.)"""
    assert FRAMEWORK == "tf", "shutdown_pending runs with FAULT_FRAMEWORK=tf"
    start()
    if hvd.rank() == 0:
        outcome = []

        def pending():
            try:
                hvd.allreduce(tf.ones([2]), name="never_submitted_elsewhere")
                outcome.append("COMPLETED")
            except tf.errors.AbortedError as e:
                outcome.append("ABORTED " + one_line(e.message))
                say_failure("THREAD", e)
            except Exception as e:  # noqa: BLE001 - reported to the test
                outcome.append(f"OTHER {type(e).__name__} {one_line(str(e))}")
        thread = threading.Thread(target=pending)
        thread.start()
        _wait_until_queued()
        begin = time.time()
        hvd.shutdown()
        thread.join(timeout=10)
        say("SHUTDOWN_TOOK", f"{time.time() - begin:.3f}")
        say("THREAD", "HUNG" if thread.is_alive() else outcome[0])
        try:
            hvd.allreduce(tf.ones([1]), name="after_shutdown")
        except tf.errors.FailedPreconditionError as e:
            say("AFTER", one_line(e.message))
            say_failure("AFTER", e)
    else:
        deadline = time.time() + 20
        while hvd.is_initialized() and time.time() < deadline:
            time.sleep(0.05)
        try:
            hvd.allreduce(tf.ones([1]), name="after_peer_shutdown")
            say("PEER", "COMPLETED")
        except tf.errors.AbortedError as e:
            say("PEER", one_line(e.message))
            say_failure("PEER", e)


def loop():
    """Collectives until stopped from outside (Ctrl-C on tfringrun)."""
    start()
    n = 0
    while True:
        hvd.allreduce(ones(256), name="loop")
        n += 1
        if n == 20:
            _write(f"looping.{hvd.rank()}", "1")


def log():
    """A few collectives at whatever TFRING_LOG_LEVEL the job has; rank 1
    turns timestamps on for itself."""
    if RANK == 1:
        os.environ["TFRING_LOG_TIMESTAMPS"] = "1"
    start()
    hvd.allgather(ones(1), name="log_gather")
    hvd.shutdown()
    say("DONE")


if __name__ == "__main__":
    {"dead_rank": dead_rank, "stall": stall, "shutdown_pending": shutdown_pending,
     "loop": loop, "log": log}[SCENARIO]()
