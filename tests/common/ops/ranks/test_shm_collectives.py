"""Collectives through the shared-memory data plane, checked against numpy.

Launched by tests/common/ops/test_shm_data_plane.py with
TFRING_CPU_OPERATIONS=shm and TFRING_SHM_MIN_BYTES=0, so every allreduce,
allgather, broadcast and reducescatter of one host runs on that plane, and
TFRING_SHM_SINGLE_COPY=1 and TFRING_SHM_SINGLE_COPY_MIN_BYTES=0, so every
broadcast and allgather reads the source rank's memory directly where the
system allows it. Sizes sit around the plane's cut-overs: the one-step allreduce limit (64 KiB), one
rank's chunk per step and one block (ranks x chunk), plus odd and empty ones.
"""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd

DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
          tf.float32, tf.float64]
OPS = [hvd.Sum, hvd.Min, hvd.Max, hvd.Product, hvd.Average]
SMALL_ALLREDUCE_BYTES = 64 * 1024


def chunk_bytes(size):
    """One rank's bytes per step, as shm_data_plane.cc picks it by default."""
    return -(-(512 * 1024 // size) // 4096) * 4096


def values(r, n, salt=0):
    """Small positive integers that differ by rank: exact in every dtype and
    for every op over 3 ranks (a product of three is at most 27)."""
    return 1 + (np.arange(n, dtype=np.int64) * 7 + r * 3 + salt) % 3


def expected(op, dtype, size, n, salt=0):
    xs = np.stack([values(r, n, salt) for r in range(size)]).astype(np.float64)
    out = {hvd.Sum: xs.sum(0), hvd.Min: xs.min(0), hvd.Max: xs.max(0), hvd.Product: xs.prod(0),
           hvd.Average: xs.sum(0) / size}[op]
    if op == hvd.Average and dtype.is_integer:
        out = np.trunc(out)
    return out


def check(actual, want, dtype, what):
    actual = np.asarray(actual)
    assert actual.shape == np.shape(want), f"{what}: shape {actual.shape} != {np.shape(want)}"
    tol = {tf.float16: 1e-3, tf.bfloat16: 1e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(actual.astype(np.float64), want, rtol=tol, atol=tol,
                               err_msg=f"{what} {dtype.name}")


def boundary_counts(dtype, size):
    """Element counts at and around each cut-over, for `dtype`."""
    esize = dtype.size
    chunk = chunk_bytes(size)
    counts = {1, 3, 1001}
    for edge in (SMALL_ALLREDUCE_BYTES, chunk, size * chunk):
        base = edge // esize
        counts |= {base - 1, base, base + 1}
    counts.add(2 * size * chunk // esize + 7)
    return sorted(c for c in counts if c > 0)


def test_allreduce_every_dtype_and_op(rank, size):
    for dtype in DTYPES:
        for op in OPS:
            for n in (1, 1001, chunk_bytes(size) // dtype.size + 1):
                out = hvd.allreduce(tf.constant(values(rank, n, n), dtype=dtype), op=op,
                                    name=f"shm.ar.{dtype.name}.{op}.{n}")
                check(out, expected(op, dtype, size, n, n), dtype, f"allreduce op {op} n={n}")


@pytest.mark.parametrize("dtype", [tf.uint8, tf.float16, tf.bfloat16, tf.float32, tf.float64,
                                   tf.int64])
def test_allreduce_sizes_around_chunk_boundaries(rank, size, dtype):
    for n in boundary_counts(dtype, size):
        for op in (hvd.Sum, hvd.Max):
            out = hvd.allreduce(tf.constant(values(rank, n, 5), dtype=dtype), op=op,
                                name=f"shm.edge.{dtype.name}.{op}.{n}")
            check(out, expected(op, dtype, size, n, 5), dtype, f"allreduce op {op} n={n}")


def test_allreduce_bool(rank, size):
    for n in (1, 33, 70001):
        mine = values(rank, n) != 2
        everyone = np.stack([values(r, n) != 2 for r in range(size)])
        for op, want in ((hvd.Sum, everyone.any(0)), (hvd.Max, everyone.any(0)),
                         (hvd.Min, everyone.all(0))):
            out = hvd.allreduce(tf.constant(mine), op=op, name=f"shm.bool.{op}.{n}")
            np.testing.assert_array_equal(out.numpy(), want)


def test_allreduce_empty_and_scalar(rank, size):
    out = hvd.allreduce(tf.zeros([0, 3], tf.float32), op=hvd.Sum, name="shm.empty")
    assert out.shape == (0, 3)
    out = hvd.allreduce(tf.constant(float(rank + 1)), op=hvd.Sum, name="shm.scalar")
    assert float(out) == size * (size + 1) / 2


def test_allreduce_scale_factors(rank, size):
    n = 3 * chunk_bytes(size) // 4 + 5
    out = hvd.allreduce(tf.constant(values(rank, n), tf.float32), op=hvd.Average,
                        prescale_factor=2.0, postscale_factor=0.5, name="shm.scaled")
    check(out, expected(hvd.Average, tf.float32, size, n), tf.float32, "scaled average")


def test_fused_allreduces_in_one_function(rank, size):
    @tf.function
    def step():
        return [hvd.allreduce(tf.fill([1000 + 37 * i], float(i + rank)), op=hvd.Sum,
                              name=f"shm.fused.{i}") for i in range(60)]
    for i, out in enumerate(step()):
        want = sum(float(i + r) for r in range(size))
        np.testing.assert_array_equal(out.numpy(), np.full([1000 + 37 * i], want, np.float32))


def test_allreduce_64mb(rank, size):
    n = 16 * 1024 * 1024
    out = hvd.allreduce(tf.constant(values(rank, n, 9), tf.float32), op=hvd.Sum, name="shm.64mb")
    want = sum(values(r, n, 9) for r in range(size)).astype(np.float32)
    np.testing.assert_array_equal(out.numpy(), want)


def test_allgather_uneven_and_empty(rank, size):
    slot = size * chunk_bytes(size)
    row_bytes = 3 * 4
    for case, rows_of in enumerate([
            lambda r: r + 1,                           # tiny
            lambda r: 0 if r == 0 else 2 * r + 1,      # one rank sends nothing
            lambda r: slot // row_bytes + r,           # around one slot
            lambda r: (r * slot + 5) // row_bytes,     # very uneven, crossing slots
            lambda r: 0]):                             # nobody sends anything
        rows = [rows_of(r) for r in range(size)]
        mine = np.full([rows[rank], 3], rank, np.float32) + np.arange(rows[rank] * 3).reshape(-1, 3)
        out = hvd.allgather(tf.constant(mine), name=f"shm.ag.{case}")
        want = np.concatenate([np.full([rows[r], 3], r, np.float32) +
                               np.arange(rows[r] * 3).reshape(-1, 3) for r in range(size)])
        np.testing.assert_array_equal(out.numpy(), want)


def test_allgather_dtypes(rank, size):
    for dtype in DTYPES + [tf.bool]:
        mine = values(rank, 5 * (rank + 1)).reshape(rank + 1, 5)
        out = hvd.allgather(tf.constant(mine if dtype != tf.bool else mine != 2, dtype=dtype),
                            name=f"shm.agd.{dtype.name}")
        want = np.concatenate([values(r, 5 * (r + 1)).reshape(r + 1, 5) for r in range(size)])
        if dtype == tf.bool:
            want = want != 2
        np.testing.assert_array_equal(out.numpy().astype(np.float64), want.astype(np.float64))


def test_broadcast_every_root_and_size(rank, size):
    slot = size * chunk_bytes(size)
    for root in range(size):
        for n in (0, 1, 7, slot - 1, slot, slot + 1, 3 * slot + 11):
            mine = np.full([n], rank, np.uint8) + (np.arange(n) % 200).astype(np.uint8)
            out = hvd.broadcast(tf.constant(mine), root_rank=root, name=f"shm.bc.{root}.{n}")
            np.testing.assert_array_equal(
                out.numpy(), np.full([n], root, np.uint8) + (np.arange(n) % 200).astype(np.uint8))


def test_broadcast_dtypes(rank, size):
    for dtype in DTYPES:
        out = hvd.broadcast(tf.constant(values(rank, 4099), dtype=dtype), root_rank=size - 1,
                            name=f"shm.bcd.{dtype.name}")
        check(out, values(size - 1, 4099).astype(np.float64), dtype, "broadcast")


def test_reducescatter_uneven(rank, size):
    chunk = chunk_bytes(size)
    for dtype in (tf.float32, tf.int32, tf.float16, tf.bfloat16, tf.uint8, tf.float64):
        for op in OPS:
            for rows in (size, 2 * size + 1, 1):
                cols = 3
                if rows == 2 * size + 1:
                    cols = chunk // dtype.size // 2 + 1  # each share crosses a chunk
                n = rows * cols
                x = values(rank, n, rows).reshape(rows, cols)
                out = hvd.reducescatter(tf.constant(x, dtype=dtype), op=op,
                                        name=f"shm.rs.{dtype.name}.{op}.{rows}")
                full = expected(op, dtype, size, n, rows).reshape(rows, cols)
                # The first rows % size ranks get one extra row.
                counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
                start = sum(counts[:rank])
                check(out, full[start:start + counts[rank]], dtype, f"reducescatter {op} rows={rows}")


def test_reducescatter_empty(rank, size):
    out = hvd.reducescatter(tf.zeros([0, 4], tf.float32), op=hvd.Sum, name="shm.rs.empty")
    assert out.shape == (0, 4)


def test_process_set_gets_its_own_segment(rank, size):
    if size < 3:
        pytest.skip("needs a proper subset of at least two ranks")
    pair = hvd.add_process_set([0, size - 1])
    try:
        if rank in (0, size - 1):
            n = 2 * chunk_bytes(2) // 4 + 3
            out = hvd.allreduce(tf.constant(values(rank, n), tf.float32), op=hvd.Sum,
                                process_set=pair, name="shm.pair")
            want = (values(0, n) + values(size - 1, n)).astype(np.float32)
            np.testing.assert_array_equal(out.numpy(), want)
        out = hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name="shm.after.pair")
        assert float(out) == size
    finally:
        assert hvd.remove_process_set(pair)
