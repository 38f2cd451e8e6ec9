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


def local_data(rank, size, steps=STEPS):
    """This rank's batches of the global data, one after the other."""
    x, y = global_data(size)
    return tuple(np.concatenate([local_batch(a, s, rank, size) for s in range(steps)])
                 for a in (x, y))


def initial_weights(rank):
    # Different on every rank: the training code must broadcast them.
    rng = np.random.RandomState(rank)
    return rng.randn(FEATURES, 1).astype(np.float32), rng.randn(1).astype(np.float32)


def _gradient(w, b, xs, ys):
    """The mean squared error's gradient for x @ w + b, in float64."""
    xs, ys = xs.astype(np.float64), ys.astype(np.float64)
    err = xs @ w + b - ys
    return 2 * xs.T @ err / len(xs), 2 * err.sum(0) / len(xs)


def _as_float64(weights):
    return tuple(v.astype(np.float64) for v in weights)


def reference(size, steps=STEPS, accumulate=1, lr=LR, first_step_from_own_weights=False,
              epochs=1):
    """One process, batch size*BATCH, from rank 0's initial weights. With
    accumulate=k it sums the gradients of k consecutive batches per update;
    with epochs=n it goes over the `steps` batches n times (fit's epochs).

    With first_step_from_own_weights, the first update is what `size` ranks
    do when their variables are broadcast only at the end of the first batch
    (Horovod's BroadcastGlobalVariablesCallback, or a model built in its first
    step): each rank's gradient is taken at its own initial weights on its own
    batch, and their average is applied to rank 0's weights."""
    x, y = global_data(size)
    w, b = _as_float64(initial_weights(0))
    gw, gb = 0, 0
    for done in range(epochs * steps):
        step = done % steps
        if done == 0 and first_step_from_own_weights:
            per_rank = [_gradient(*_as_float64(initial_weights(r)), local_batch(x, 0, r, size),
                                  local_batch(y, 0, r, size)) for r in range(size)]
            dw, db = (np.mean(g, 0) for g in zip(*per_rank))
        else:
            rows = slice(step * size * BATCH, (step + 1) * size * BATCH)
            dw, db = _gradient(w, b, x[rows], y[rows])
        gw, gb = gw + dw, gb + db
        if (done + 1) % accumulate == 0:
            w, b = w - lr * gw, b - lr * gb
            gw, gb = 0, 0
    return w, b


def assert_trained_like_reference(w, b, size, rtol=1e-5, atol=1e-6, **kwargs):
    ref_w, ref_b = reference(size, **kwargs)
    np.testing.assert_allclose(w, ref_w, rtol=rtol, atol=atol)
    np.testing.assert_allclose(b, ref_b, rtol=rtol, atol=atol)
    everyone = hvd.allgather_object((np.asarray(w).tolist(), np.asarray(b).tolist()))
    assert all(e == everyone[0] for e in everyone), "ranks ended with different weights"


def reference_with_local_part(size, steps=STEPS, lr=LR, scale_local=True):
    """The model x @ (w + u) + b trained on `size` ranks where w and b are
    shared (gradients averaged) and u is local to each rank (its gradient is
    not reduced; divided by size when scale_local, Horovod's convention).
    u starts at zeros. Returns w, b and the list of every rank's u."""
    x, y = global_data(size)
    w, b = _as_float64(initial_weights(0))
    us = [np.zeros_like(w) for _ in range(size)]
    for step in range(steps):
        # d/du of x @ (w + u) is d/dw: the gradient at weights w + u.
        gws, gbs = zip(*[_gradient(w + us[r], b, local_batch(x, step, r, size),
                                   local_batch(y, step, r, size)) for r in range(size)])
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
