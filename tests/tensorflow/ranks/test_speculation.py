"""Speculation (tf_ops/common/controller.h): in the steady state the ranks
run cached allreduces without negotiating, and when one rank does something
else (another tensor, another shape, another order, join, shutdown, a late
start) every rank still gets the right result or the documented error.

Each test first runs a steady chain of eager allreduces long enough for the
ranks to enter speculative mode (checked with the internal counters), then
makes the last rank diverge. Every blocking call that could hang if the
fallback were wrong runs on a Background thread with a timeout.
"""
import time

import numpy as np
import pytest
import tensorflow as tf
from error_helpers import Background, expect_precondition, multi_rank, needs_peers  # noqa: F401

import tfring.tensorflow as hvd
from tfring.common.basics import _speculation_stats

NAMES = ["spec_a", "spec_b", "spec_c"]


def mine(rank, shape=(4,)):
    return tf.fill(list(shape), float(rank + 1))


def total(size, ranks=None):
    return float(sum(r + 1 for r in (range(size) if ranks is None else ranks)))


def reduce_named(rank, size, name, shape=(4,)):
    out = hvd.allreduce(mine(rank, shape), op=hvd.Sum, name=name)
    np.testing.assert_array_equal(out.numpy(), np.full(shape, total(size), np.float32))


def steady(rank, size, reps=20):
    """Runs the chain until the ranks speculate; returns the counters then.

    A fixed number of passes, the same on every rank: deciding on this rank's
    counters, which the background thread updates a moment after a result is
    handed over, could make the ranks' programs part ways. 20 passes cover
    entering after fallbacks earlier in this process (kSpeculationMaxRounds)."""
    before = _speculation_stats()
    for _ in range(reps):
        for name in NAMES:
            reduce_named(rank, size, name)
    stats = _speculation_stats()
    assert stats["responses"] >= before["responses"] + len(NAMES) - 1, (before, stats)
    return stats


def test_steady_chain_runs_without_negotiation(rank, size):
    before = steady(rank, size)
    for _ in range(5):
        for name in NAMES:
            reduce_named(rank, size, name)
        # Average rides on the same path (postscale by the rank count).
        out = hvd.allreduce(mine(rank), op=hvd.Average, name="spec_avg")
        np.testing.assert_allclose(out.numpy(), np.full(4, total(size) / size), rtol=1e-6)
    after = _speculation_stats()
    # A new tensor ("spec_avg") joins the chain: at most a fallback or two
    # while the ranks learn the longer round, then speculation again.
    assert after["responses"] > before["responses"], (before, after)
    for _ in range(20):
        for name in NAMES + ["spec_avg"]:
            out = hvd.allreduce(mine(rank), op=hvd.Sum if name != "spec_avg" else hvd.Average,
                                name=name)
    later = _speculation_stats()
    assert later["responses"] >= after["responses"] + 8, (after, later)


@multi_rank
def test_one_rank_sends_a_tensor_not_in_the_schedule(rank, size):
    before = steady(rank, size)
    last = size - 1
    if rank == last:
        # Sent first, on a thread: the others send it only after the next
        # two of the chain.
        extra = Background(lambda: hvd.allreduce(mine(rank), op=hvd.Sum, name="spec_extra"))
        time.sleep(0.05)
        reduce_named(rank, size, "spec_a")
        reduce_named(rank, size, "spec_b")
        out = extra.wait(60).value
    else:
        reduce_named(rank, size, "spec_a")
        reduce_named(rank, size, "spec_b")
        out = hvd.allreduce(mine(rank), op=hvd.Sum, name="spec_extra")
    reduce_named(rank, size, "spec_c")
    np.testing.assert_array_equal(out.numpy(), np.full(4, total(size), np.float32))
    assert _speculation_stats()["fallbacks"] > before["fallbacks"]
    steady(rank, size)


@multi_rank
def test_one_rank_changes_a_shape(rank, size):
    before = steady(rank, size)
    shape = (8,) if rank == size - 1 else (4,)
    reduce_named(rank, size, "spec_a")
    expect_precondition(lambda: hvd.allreduce(mine(rank, shape), op=hvd.Sum, name="spec_b"),
                        "Mismatched ALLREDUCE tensor shapes for tensor 'spec_b'")
    assert _speculation_stats()["fallbacks"] > before["fallbacks"]
    # The cache entry was dropped everywhere; the chain settles again.
    reduce_named(rank, size, "spec_c")
    steady(rank, size)


@multi_rank
def test_one_rank_sends_in_another_order(rank, size):
    before = steady(rank, size)
    if rank == size - 1:
        # "spec_c" before "spec_a" (on a thread, since the others need "spec_a"
        # first): it is in the schedule, so it is held until its turn.
        c = Background(lambda: hvd.allreduce(mine(rank), op=hvd.Sum, name="spec_c"))
        time.sleep(0.05)
        reduce_named(rank, size, "spec_a")
        reduce_named(rank, size, "spec_b")
        out = c.wait(60).value
        np.testing.assert_array_equal(out.numpy(), np.full(4, total(size), np.float32))
    else:
        for name in NAMES:
            reduce_named(rank, size, name)
    after = _speculation_stats()
    assert after["fallbacks"] == before["fallbacks"], (before, after)
    assert after["responses"] >= before["responses"] + 2, (before, after)


@multi_rank
def test_a_late_rank_does_not_make_the_others_fall_back(rank, size):
    before = steady(rank, size)
    for step in range(3):
        if rank == size - 1:
            time.sleep(0.2)  # a slower forward pass on one rank
        for name in NAMES:
            reduce_named(rank, size, name)
    after = _speculation_stats()
    assert after["fallbacks"] == before["fallbacks"], (before, after)
    # (The counters may lag a result by one response on either reading.)
    assert after["responses"] >= before["responses"] + 7, (before, after)


@multi_rank
def test_one_rank_joins(rank, size):
    before = steady(rank, size)
    last = size - 1
    # join() returns the last rank to join: one of those that went on.
    if rank == last:
        assert Background(hvd.join).wait(120).value in range(size - 1)
    else:
        # The joined rank counts as zeros.
        for _ in range(2):
            for name in NAMES:
                out = hvd.allreduce(mine(rank), op=hvd.Sum, name=name)
                np.testing.assert_array_equal(
                    out.numpy(), np.full(4, total(size, range(size - 1)), np.float32))
        assert Background(hvd.join).wait(120).value in range(size - 1)
    assert _speculation_stats()["fallbacks"] > before["fallbacks"]
    steady(rank, size)


@multi_rank
def test_one_rank_shuts_down(rank, size):
    # Last in the file: it stops tfring on every rank and starts it again.
    steady(rank, size)
    if rank == size - 1:
        hvd.shutdown()
    else:
        # Held for the schedule when the last rank leaves it: shut down.
        pending = Background(lambda: hvd.allreduce(mine(rank), op=hvd.Sum, name="spec_a"))
        pending.wait(120)
        assert isinstance(pending.error, tf.errors.AbortedError), pending.error
        assert f"rank {size - 1} called shutdown()" in str(pending.error)
        hvd.shutdown()
    hvd.init()
    reduce_named(rank, size, "spec_after_restart")
