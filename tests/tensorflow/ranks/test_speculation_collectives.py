"""Speculation beyond small float allreduces (tf_ops/common/controller.h,
FlagRidesAlong): broadcasts, allgathers, large allreduces and the other
reductions are speculated too, with the divergence flag in a one-element
allreduce of its own before the collective runs straight from the inputs
into the outputs. Every result is checked, in the steady state and when a
rank leaves the schedule, and each test checks through the internal
counters that the responses really were speculated.
"""
import numpy as np
import tensorflow as tf
from error_helpers import expect_precondition, multi_rank, needs_peers  # noqa: F401

import tfring.tensorflow as hvd
from tfring.common.basics import _speculation_stats

BIG = 256 * 1024  # float32 elements: 1 MB, past what the flag rides along with


def rows(rank, extra=0):
    """This rank's allgather input: rank + 1 (+ extra) rows of [rank, 0, 1]."""
    n = rank + 1 + extra
    return tf.constant([[float(rank), 0.0, 1.0]] * n)


def want_gathered(size, extra_on_last=0):
    parts = []
    for r in range(size):
        n = r + 1 + (extra_on_last if r == size - 1 else 0)
        parts.append(np.tile(np.array([[float(r), 0.0, 1.0]], np.float32), (n, 1)))
    return np.concatenate(parts)


def one_step(rank, size, extra_rows=0):
    """One pass of a chain that mixes every kind the flag travels alone for."""
    b0 = hvd.broadcast(tf.fill([5], float(rank + 10)), root_rank=0, name="specc_bcast0")
    np.testing.assert_array_equal(b0.numpy(), np.full(5, 10.0, np.float32))
    last = size - 1
    b1 = hvd.broadcast(tf.fill([2, 3], rank + 7), root_rank=last, name="specc_bcast_last")
    np.testing.assert_array_equal(b1.numpy(), np.full((2, 3), last + 7, np.int32))
    g = hvd.allgather(rows(rank, extra_rows if rank == last else 0), name="specc_gather")
    np.testing.assert_array_equal(g.numpy(), want_gathered(size, extra_rows))
    big = hvd.allreduce(tf.fill([BIG], float(rank + 1)), op=hvd.Sum, name="specc_big")
    total = float(size * (size + 1) // 2)
    got = big.numpy()
    assert got[0] == total and got[-1] == total and np.all(got == total)
    m = hvd.allreduce(tf.constant([rank, -rank, 3], tf.int32), op=hvd.Max, name="specc_max")
    np.testing.assert_array_equal(m.numpy(), [size - 1, 0, 3])


STEP = 5  # responses per pass of one_step


def steady(rank, size, passes=20):
    """Runs the chain until the ranks speculate (a fixed number of passes on
    every rank: enough after fallbacks earlier in this process)."""
    before = _speculation_stats()
    for _ in range(passes):
        one_step(rank, size)
    after = _speculation_stats()
    assert after["responses"] >= before["responses"] + STEP, (before, after)
    return after


def test_broadcasts_allgathers_and_other_allreduces_run_without_negotiation(rank, size):
    before = steady(rank, size)
    for _ in range(10):
        one_step(rank, size)
    after = _speculation_stats()
    assert after["fallbacks"] == before["fallbacks"], (before, after)
    # (The counters may lag a result by one response on either reading.)
    assert after["responses"] >= before["responses"] + 10 * STEP - 1, (before, after)


@multi_rank
def test_one_rank_gathers_more_rows_and_everyone_gets_them(rank, size):
    # Ranks may gather different first dimensions; the last rank changing its
    # own leaves the schedule, and the gather is negotiated with the new sizes.
    before = steady(rank, size)
    one_step(rank, size, extra_rows=2)
    assert _speculation_stats()["fallbacks"] > before["fallbacks"]
    steady(rank, size)


@multi_rank
def test_one_rank_broadcasts_from_another_root(rank, size):
    before = steady(rank, size)
    root = 1 if rank == size - 1 else 0
    expect_precondition(
        lambda: hvd.broadcast(tf.fill([5], float(rank + 10)), root_rank=root,
                              name="specc_bcast0"),
        "Mismatched BROADCAST root ranks for tensor 'specc_bcast0'")
    assert _speculation_stats()["fallbacks"] > before["fallbacks"]
    # The rest of the pass, then the chain settles again.
    steady(rank, size)


def test_a_broadcast_chain_in_a_function_runs_on_the_submitting_threads(rank, size):
    @tf.function
    def chain(t):
        # Each broadcast consumes the last one's output: nothing fuses.
        for i in range(6):
            t = hvd.broadcast(t + 1.0, root_rank=i % size, name=f"specc_chain_{i}")
        return t

    x = tf.fill([1024], float(rank))

    def run(calls):
        for _ in range(calls):
            # Root i % size adds 1 to what the previous broadcast handed out.
            np.testing.assert_array_equal(chain(x).numpy(), np.full(1024, 6.0, np.float32))

    # rank 0's input is 0: the first broadcast (root 0) gives 1, then +1 each.
    run(20)
    before = _speculation_stats()
    run(20)
    after = _speculation_stats()
    assert after["fallbacks"] == before["fallbacks"], (before, after)
    assert after["responses"] - before["responses"] >= 19 * 6, (before, after)
    assert after["inline"] - before["inline"] >= 6, (before, after)
