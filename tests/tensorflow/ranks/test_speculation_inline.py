"""Speculated collectives run on the thread that submits them
(TFRING_SPECULATION_INLINE, on by default; tf_ops/common/background_loop.cc,
DriveInline): in the steady state a chain of allreduces inside a
tf.function is run by TF's own threads, with no hand-off to the background
thread, and still falls back cleanly when the ranks leave the schedule.

The counters say which thread ran what (``inline``: responses run by a
submitting thread), so these tests check the policy, not the clock.
"""
import numpy as np
import tensorflow as tf
from error_helpers import multi_rank, needs_peers  # noqa: F401

import tfring.tensorflow as hvd
from tfring.common.basics import _speculation_stats

LENGTH = 8


def make_chain(names):
    @tf.function
    def chain(t):
        # Each allreduce consumes the last one's output: nothing fuses.
        for name in names:
            t = hvd.allreduce(t, op=hvd.Average, name=name)
        return t
    return chain


def run(chain, rank, size, calls):
    x = tf.fill([1024], float(rank + 1))
    want = (size + 1) / 2.0  # the average of 1..size, kept by every later average
    for _ in range(calls):
        np.testing.assert_allclose(chain(x).numpy(), np.full(1024, want), rtol=1e-6)


NAMES = [f"inline_{i}" for i in range(LENGTH)]


def test_a_steady_chain_in_a_function_runs_on_the_submitting_threads(rank, size):
    chain = make_chain(NAMES)
    # Enough calls to enter speculative mode, whatever earlier tests left
    # (each fallback doubles the rounds needed, up to 16).
    run(chain, rank, size, 20)
    before = _speculation_stats()
    run(chain, rank, size, 20)
    after = _speculation_stats()
    assert after["fallbacks"] == before["fallbacks"], (before, after)
    # Most responses run on a TF thread; the background thread takes those
    # submitted while it happened to be driving a cycle of its own.
    assert after["inline"] - before["inline"] >= LENGTH, (before, after)
    assert after["responses"] - before["responses"] >= 19 * LENGTH, (before, after)


def test_a_new_tensor_in_the_chain_falls_back_and_is_right(rank, size):
    chain = make_chain(NAMES)
    run(chain, rank, size, 20)
    before = _speculation_stats()
    # Every rank submits a tensor the schedule does not know, in the middle
    # of the chain, from a TF thread that would run it inline: the ranks
    # fall back, negotiate, and the result is the same.
    longer = make_chain(NAMES[:4] + ["inline_new"] + NAMES[4:])
    run(longer, rank, size, 1)
    after = _speculation_stats()
    assert after["fallbacks"] > before["fallbacks"], (before, after)
    # And the ranks settle into the longer chain, inline again.
    run(longer, rank, size, 30)
    later = _speculation_stats()
    assert later["inline"] > after["inline"], (after, later)


@multi_rank
def test_a_late_rank_does_not_make_the_others_fall_back(rank, size):
    import time
    chain = make_chain(NAMES)
    run(chain, rank, size, 20)
    before = _speculation_stats()
    for _ in range(3):
        if rank == size - 1:
            time.sleep(0.2)  # the others wait inside an inline response
        run(chain, rank, size, 1)
    after = _speculation_stats()
    assert after["fallbacks"] == before["fallbacks"], (before, after)
    assert after["responses"] - before["responses"] >= 3 * LENGTH - 1, (before, after)
