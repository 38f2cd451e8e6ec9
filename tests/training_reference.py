"""The single-process reference for the numerical-equivalence tests.

N ranks, each with batch BATCH, must train a linear model to the same weights
as one process with batch N*BATCH. The global data, each rank's slice of it,
each rank's (different) initial weights and the reference SGD live here so
that the TensorFlow and Keras suites check against the same thing.
"""
import numpy as np

import tfring.tensorflow as hvd

FEATURES, BATCH, STEPS, LR = 4, 3, 5, 0.1


def global_data(size):
    rng = np.random.RandomState(1234)
    x = rng.randn(STEPS * size * BATCH, FEATURES).astype(np.float32)
    y = (x @ np.arange(1, FEATURES + 1, dtype=np.float32)[:, None] + 0.5).astype(np.float32)
    return x, y


def local_batch(x, step, rank, size):
    start = step * size * BATCH + rank * BATCH
    return x[start:start + BATCH]


def initial_weights(rank):
    # Different on every rank: the training code must broadcast them.
    rng = np.random.RandomState(rank)
    return rng.randn(FEATURES, 1).astype(np.float32), rng.randn(1).astype(np.float32)


def reference(size, steps=STEPS, accumulate=1, lr=LR):
    """One process, batch size*BATCH, from rank 0's initial weights. With
    accumulate=k it sums the gradients of k consecutive batches per update."""
    x, y = global_data(size)
    w, b = initial_weights(0)
    w, b = w.astype(np.float64), b.astype(np.float64)
    gw, gb = 0, 0
    for step in range(steps):
        xs = x[step * size * BATCH:(step + 1) * size * BATCH].astype(np.float64)
        ys = y[step * size * BATCH:(step + 1) * size * BATCH].astype(np.float64)
        err = xs @ w + b - ys
        gw = gw + 2 * xs.T @ err / len(xs)
        gb = gb + 2 * err.sum(0) / len(xs)
        if (step + 1) % accumulate == 0:
            w, b = w - lr * gw, b - lr * gb
            gw, gb = 0, 0
    return w, b


def assert_trained_like_reference(w, b, size, **kwargs):
    ref_w, ref_b = reference(size, **kwargs)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)
    everyone = hvd.allgather_object((np.asarray(w).tolist(), np.asarray(b).tolist()))
    assert all(e == everyone[0] for e in everyone), "ranks ended with different weights"


def reference_with_local_part(size, steps=STEPS, lr=LR, scale_local=True):
    """The model x @ (w + u) + b trained on `size` ranks where w and b are
    shared (gradients averaged) and u is local to each rank (its gradient is
    not reduced; divided by size when scale_local, Horovod's convention).
    u starts at zeros. Returns w, b and the list of every rank's u."""
    x, y = global_data(size)
    w, b = (v.astype(np.float64) for v in initial_weights(0))
    us = [np.zeros_like(w) for _ in range(size)]
    for step in range(steps):
        gws, gbs = [], []
        for r in range(size):
            xs = local_batch(x, step, r, size).astype(np.float64)
            ys = local_batch(y, step, r, size).astype(np.float64)
            err = xs @ (w + us[r]) + b - ys
            gws.append(2 * xs.T @ err / len(xs))
            gbs.append(2 * err.sum(0) / len(xs))
        w, b = w - lr * np.mean(gws, 0), b - lr * np.mean(gbs, 0)
        us = [u - lr * g / (size if scale_local else 1) for u, g in zip(us, gws)]
    return w, b, us


def assert_local_part_like_reference(w, b, u, rank, size, **kwargs):
    """w, b must match the reference on every rank, u this rank's own u."""
    ref_w, ref_b, ref_us = reference_with_local_part(size, **kwargs)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(u, ref_us[rank], rtol=1e-5, atol=1e-6)
    everyone = hvd.allgather_object(np.asarray(u).tolist())
    if size > 1:
        # Each rank saw its own data: the local parts stayed apart.
        assert everyone[0] != everyone[1], "the local variable was reduced across ranks"
