"""init/shutdown paths, topology from the launcher, and the build check.

Start-up and shutdown are tfring.common.startup's, shared by every binding,
so the multi-rank jobs run on tfring.core with numpy arrays (a rank starts in
a fraction of a second); what is particular to tfring.tensorflow (its error
types before init()) runs there."""
import subprocess
import sys
import textwrap

import pytest

from support import ROOT, rank_lines


def python(code, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_calls_before_init_say_to_call_init():
    result = python("""
        import tensorflow as tf
        import tfring.tensorflow as hvd
        for call in (lambda: hvd.allreduce(tf.ones([2])), hvd.rank, hvd.size,
                     lambda: hvd.broadcast(tf.ones([1]), 0)):
            try:
                call()
            except tf.errors.FailedPreconditionError as e:
                assert "has not been initialized; use hvd.init()" in e.message, e.message
            else:
                raise SystemExit("no error before init()")
        assert not hvd.is_initialized()
        print("OK")
    """)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr


def test_topology_lines(run_ranks, controller):
    result = run_ranks(3, [sys.executable, "-c",
                           "import tfring.core as hvd; hvd.init(); "
                           "print(hvd.rank(), hvd.size(), hvd.local_rank())"], timeout=120,
                       controller=controller)
    assert result.returncode == 0, result.stdout
    lines = sorted(text for _, text in rank_lines(result.stdout))
    assert lines == ["0 3 0", "1 3 1", "2 3 2"], result.stdout


SHUTDOWN_SCRIPT = """
import os
import numpy as np
import tfring.core as hvd
hvd.init()
hvd.init()  # idempotent
# Every rank has made both init() calls before any rank shuts down: a rank
# whose second init() came after a peer's shutdown() would find the job
# stopped and start a new one (init() after a stop starts afresh), and
# this script's later steps would pair up with the wrong init() calls.
hvd.allreduce(np.ones(1, np.float32))
hvd.shutdown()
hvd.shutdown()  # idempotent
try:
    hvd.allreduce(np.ones(1, np.float32))
except (hvd.PreconditionError, hvd.AbortedError) as e:
    assert "shut down" in e.message, e.message
else:
    raise SystemExit("collective after shutdown() did not fail")
# A setting tfring cannot use is refused by init() on every rank, naming it,
# before any rank waits for another.
os.environ["TFRING_ALLREDUCE_ALGORITHM"] = "fastest"
try:
    hvd.init()
except hvd.PreconditionError as e:
    assert "TFRING_ALLREDUCE_ALGORITHM='fastest' names no allreduce algorithm" in e.message, e.message
else:
    raise SystemExit("init() took an unknown allreduce algorithm")
del os.environ["TFRING_ALLREDUCE_ALGORITHM"]
hvd.init()  # starts afresh
assert hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum)[0] == hvd.size()
print("OK", hvd.rank())
"""


@pytest.mark.parametrize("np_", [2, 3])
def test_shutdown_then_reinit(run_ranks, np_, controller):
    result = run_ranks(np_, [sys.executable, "-c", SHUTDOWN_SCRIPT], timeout=120,
                       controller=controller)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("OK") == np_, result.stdout


EARLY_EXIT_SCRIPT = """
import sys
import numpy as np
import tfring.core as hvd
hvd.init()
if hvd.rank() == 1:
    sys.exit(0)  # finishes early: atexit shuts tfring down
try:
    for _ in range(1000):
        hvd.allreduce(np.ones(1, np.float32))
except hvd.AbortedError as e:
    assert "rank 1" in e.message, e.message
    print("OK", hvd.rank(), e.message)
else:
    raise SystemExit("no error after rank 1 left")
"""


def test_rank_that_finishes_early_is_named(run_ranks, controller):
    result = run_ranks(2, [sys.executable, "-c", EARLY_EXIT_SCRIPT], timeout=120,
                       controller=controller)
    assert result.returncode == 0, result.stdout
    assert "OK 0" in result.stdout and "rank 1 finished its script" in result.stdout


RESTART_SCRIPT = """
import os
import numpy as np
import tfring.core as hvd
hvd.init()
hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum)
if hvd.rank() == 2:
    os._exit(0)  # gone without a word, as a lost worker would be
try:
    while True:
        hvd.allreduce(np.ones(1, np.float32), op=hvd.Sum)
except hvd.AbortedError as e:
    assert "rank 2" in e.message, e.message
os.environ["TFRING_SIZE"] = "2"  # the survivors go on as a job of two
hvd.init()
total = hvd.allreduce(np.array([hvd.rank() + 1.0], np.float32), op=hvd.Sum)[0]
print("RESTARTED", hvd.rank(), hvd.size(), total)
"""


def test_tcp_survivors_start_again_after_a_rank_is_lost(run_ranks):
    # Issue 9: the TCP backend declares that it can start again after
    # communication broke (MPI cannot: see test_faults.py), which elastic
    # training builds on.
    result = run_ranks(3, [sys.executable, "-c", RESTART_SCRIPT], timeout=120, controller="tcp")
    assert result.returncode == 0, result.stdout
    lines = sorted(text for _, text in rank_lines(result.stdout) if text.startswith("RESTARTED"))
    assert lines == ["RESTARTED 0 2 3.0", "RESTARTED 1 2 3.0"], result.stdout
