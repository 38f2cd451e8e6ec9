"""Bit-exact conformance with TF's own computation on one host (Horovod's
tests compare with threshold 0): every rank's allreduce, grouped allreduce
and reducescatter result equals what a single process computes with TF on
the same values in rank order. Sums are tf.add_n in rank order, averages
`sum / size` in the dtype, products tf.reduce_prod over the stacked ranks,
and scale factors are applied as Horovod's reference does (a float32 factor
times the value, in float32 for float16/bfloat16), before or after the sum.

The values have mixed magnitudes, so rank-order sums differ from other
orders; the sizes lie below and above the shared-memory plane's one-step
limit (64 KiB) and are no multiples of its chunk. Launched at np=1..3 with
the other rank suites, and alone at np=4 (tests/tensorflow/test_ranks.py).
"""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd

FLOATS = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
# Elements: one step of the shared-memory plane; several pipelined blocks
# with a partial last one (for every dtype and np <= 4).
COUNTS = [1001, 300007]
# A float32 value, as TF's float attributes carry the factors.
FACTOR = float(np.float32(0.7384))


def bits(x):
    x = np.asarray(x.numpy() if hasattr(x, "numpy") else x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def differences(got, want, what):
    """[] if `got` has `want`'s bits, else a line saying how many differ."""
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, what
    wrong = np.flatnonzero(g.ravel() != w.ravel())
    if wrong.size == 0:
        return []
    return [f"{what}: {wrong.size} of {g.size} elements differ from TF's rank-order result, "
            f"first at {wrong[0]}"]


def assert_no_differences(lines):
    # Every case runs on every rank (their collectives must line up), and all
    # that differ are listed.
    assert not lines, "\n".join(lines)


def rank_inputs(size, count, dtype, seed, product=False):
    """Every rank's values (the same on every rank), as tensors of `dtype`:
    mixed magnitudes and signs; for products, a narrow range so that float16
    products over 4 ranks stay finite."""
    rng = np.random.default_rng(seed)
    spread = 3 if product else 8
    out = []
    for _ in range(size):
        x = rng.uniform(-1, 1, count) * 2.0 ** rng.integers(-spread, spread + 1, count)
        out.append(tf.cast(tf.constant(x, tf.float64), dtype))
    return out


def scaled(x, factor):
    """Horovod's reference for a scale factor: float32 arithmetic for the
    16-bit types, the dtype's own otherwise, rounded to the dtype."""
    dtype = x.dtype
    wide = tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype
    return tf.cast(tf.constant(factor, wide) * tf.cast(x, wide), dtype)


def reference(xs, op, size, prescale=1.0, postscale=1.0):
    """TF's own result over the ranks' values `xs`, in rank order."""
    if op == hvd.Product:
        return tf.reduce_prod(tf.stack(xs), axis=0)
    if op == hvd.Min:
        return tf.reduce_min(tf.stack(xs), axis=0)
    if op == hvd.Max:
        return tf.reduce_max(tf.stack(xs), axis=0)
    if prescale != 1.0:
        xs = [scaled(x, prescale) for x in xs]
    total = tf.add_n(xs)  # in order: x0 + x1, then + x2, ...
    if postscale != 1.0:
        total = scaled(total, postscale)
    if op == hvd.Average:
        total = total / tf.cast(size, total.dtype)
    return total


# (op, prescale, postscale) as Horovod's tests use them.
CASES = [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Product, 1.0, 1.0),
         (hvd.Min, 1.0, 1.0), (hvd.Max, 1.0, 1.0), (hvd.Sum, FACTOR, 1.0),
         (hvd.Sum, 1.0, FACTOR), (hvd.Average, FACTOR, 1.0)]


OP_NAMES = {hvd.Sum: "Sum", hvd.Average: "Average", hvd.Product: "Product", hvd.Min: "Min",
            hvd.Max: "Max"}


def case_name(op, pre, post, dtype, count):
    return f"{OP_NAMES[op]} prescale {pre:g} postscale {post:g} {dtype.name} x {count}"


def all_cases():
    for i, (op, pre, post) in enumerate(CASES):
        for j, dtype in enumerate(FLOATS):
            for k, count in enumerate(COUNTS):
                yield (op, pre, post, dtype, count), 1000 * i + 10 * j + k


def test_allreduce_is_tfs_rank_order_result(rank, size):
    failures = []
    for (op, pre, post, dtype, count), seed in all_cases():
        xs = rank_inputs(size, count, dtype, seed, product=op == hvd.Product)
        got = hvd.allreduce(xs[rank], op=op, prescale_factor=pre, postscale_factor=post,
                            name=f"numerics.allreduce.{seed}")
        failures += differences(got, reference(xs, op, size, pre, post),
                                f"allreduce {case_name(op, pre, post, dtype, count)}")
    assert_no_differences(failures)


def test_grouped_allreduce_is_tfs_rank_order_result(rank, size):
    # One request of tensors of every dtype and size (fused by dtype).
    failures = []
    for op, pre, post in CASES:
        inputs, wants = [], []
        for (o, p, q, dtype, count), seed in all_cases():
            if (o, p, q) != (op, pre, post):
                continue
            xs = rank_inputs(size, count, dtype, seed + 7, product=op == hvd.Product)
            inputs.append(xs[rank])
            wants.append((reference(xs, op, size, pre, post), case_name(op, pre, post, dtype, count)))
        outs = hvd.grouped_allreduce(inputs, op=op, prescale_factor=pre, postscale_factor=post)
        for got, (want, what) in zip(outs, wants):
            failures += differences(got, want, f"grouped allreduce {what}")
    assert_no_differences(failures)


def test_reducescatter_is_tfs_rank_order_result(rank, size):
    # Uneven rows (the first rows % size ranks get one more), each share
    # above and below a chunk of the plane.
    seed, failures = 50000, []
    for op, pre, post in CASES:
        if op in (hvd.Min, hvd.Max):
            continue  # element-wise selections: no order to get wrong
        for dtype in FLOATS:
            for rows, cols in ((size * 3 + 1, 7), (size * 70 + 1, 1001)):
                seed += 1
                xs = [tf.reshape(x, [rows, cols]) for x in
                      rank_inputs(size, rows * cols, dtype, seed, product=op == hvd.Product)]
                got = hvd.reducescatter(xs[rank], op=op, prescale_factor=pre,
                                        postscale_factor=post)
                share = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
                lo = sum(share[:rank])
                want = reference(xs, op, size, pre, post)[lo:lo + share[rank]]
                failures += differences(got, want, "reducescatter " +
                                        case_name(op, pre, post, dtype, rows * cols))
    assert_no_differences(failures)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_rank_order_matters_for_these_values(size, dtype):
    """The inputs are such that another order of the sum gives other bits,
    so the tests above would see a reduction out of rank order."""
    if size < 3:
        pytest.skip("two values add up alike in either order")
    xs = rank_inputs(size, COUNTS[-1], dtype, 12345)
    backwards = tf.add_n(xs[::-1])
    rotated = tf.add_n(xs[1:] + xs[:1])
    assert np.any(bits(backwards) != bits(tf.add_n(xs)))
    assert np.any(bits(rotated) != bits(tf.add_n(xs)))
