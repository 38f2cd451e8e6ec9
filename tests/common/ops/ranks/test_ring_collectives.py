"""Collectives as the ring (or hierarchical) data plane runs them, checked
against numpy from rank-dependent inputs.

Launched by tests/common/ops/test_ring_data_plane.py with the environment that
selects the plane: TFRING_CPU_OPERATIONS=ring (the ring forced on one host),
or fake hosts through TFRING_HOSTNAME=a,a,b[,b] with the cross-host cut-over
at 0 bytes, optionally with TFRING_HIERARCHICAL_ALLREDUCE=1.

Sizes: 0, 1, size-1, odd ones, and sizes around where the ring changes its
number of pieces per block (blocks of 64 KiB and 256 KiB; pieces of 1 MiB
from 4 MiB blocks), plus one ~16 MB tensor.
"""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd

DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
          tf.float32, tf.float64]
OPS = {
    "sum": hvd.Sum,
    "average": hvd.Average,
    "min": hvd.Min,
    "max": hvd.Max,
    "product": hvd.Product,
}
TOL = {tf.float16: 1e-2, tf.bfloat16: 3e-2}


def values(r, n, dtype=tf.float32, salt=0):
    """1..3, varying by element and rank: exact in every dtype, and the
    product over 4 ranks (81) still fits in int8."""
    x = 1 + (np.arange(n, dtype=np.int64) * 7 + r + salt) % 3
    if dtype == tf.bool:
        return (np.arange(n) + r + salt) % 2 == 0
    return x


def expected(op, dtype, size, n, salt=0):
    xs = np.stack([values(r, n, dtype, salt) for r in range(size)]).astype(np.float64)
    if op == "sum":
        out = xs.sum(0)
    elif op == "average":
        out = xs.sum(0) / size
        if dtype.is_integer:
            out = np.trunc(out)  # integer averages truncate, like C division
    elif op == "min":
        out = xs.min(0)
    elif op == "max":
        out = xs.max(0)
    else:
        out = xs.prod(0)
    return out


def check(got, want, dtype, what):
    got = np.asarray(got)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape} != {np.shape(want)}"
    tol = TOL.get(dtype, 0)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol, err_msg=what)


def allreduce_np(x, dtype, op):
    return hvd.allreduce(tf.constant(x, dtype=dtype), op=OPS[op]).numpy()


def small_sizes(size):
    return sorted({0, 1, size - 1, size + 1, 13, 1001})


def test_allreduce_every_dtype_and_op(rank, size):
    """Every dtype and op: one grouped allreduce per pair, whose tensors of
    sizes 0, 1, size-1, ... are fused into one buffer of odd total size."""
    sizes = small_sizes(size)
    for dtype in DTYPES:
        for op in OPS:
            out = hvd.grouped_allreduce(
                [tf.constant(values(rank, n, dtype, salt=n), dtype) for n in sizes], op=OPS[op])
            for n, got in zip(sizes, out):
                check(got.numpy(), expected(op, dtype, size, n, salt=n), dtype,
                      f"{dtype.name} {op} n={n}")


def test_allreduce_exact_small_sizes(rank, size):
    """One tensor per collective, so the plane sees exactly 0, 1, size-1 ...
    elements (fewer than ranks: empty blocks)."""
    cases = [(tf.float32, "sum"), (tf.int8, "product"), (tf.float16, "average"),
             (tf.bfloat16, "max"), (tf.uint16, "min"), (tf.int64, "average")]
    for dtype, op in cases:
        for n in small_sizes(size):
            got = allreduce_np(values(rank, n, dtype), dtype, op)
            check(got, expected(op, dtype, size, n), dtype, f"{dtype.name} {op} n={n}")


def test_allreduce_bool(rank, size):
    everyone = np.stack([values(r, 1001, tf.bool) for r in range(size)])
    for op, want in (("sum", everyone.any(0)), ("max", everyone.any(0)),
                     ("min", everyone.all(0)), ("product", everyone.all(0))):
        for n in (0, 1, size + 1, 1001):
            got = allreduce_np(values(rank, n, tf.bool), tf.bool, op)
            np.testing.assert_array_equal(got, want[:n], err_msg=f"bool {op} n={n}")


def piece_boundary_elements(size, itemsize):
    """Element counts whose per-rank blocks sit just below and above the
    ring's piece-count changes (64 KiB and 256 KiB blocks)."""
    out = set()
    for block_bytes in (64 << 10, 256 << 10):
        elems = block_bytes // itemsize * size
        out.update({elems - 1, elems + 1, elems + size + 1})
    return sorted(out)


@pytest.mark.parametrize("dtype", [tf.uint8, tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_allreduce_around_piece_sizes(rank, size, dtype):
    for n in piece_boundary_elements(size, dtype.size):
        for op in ("sum", "max") if dtype.is_floating else ("sum", "min"):
            got = allreduce_np(values(rank, n, dtype, salt=n), dtype, op)
            check(got, expected(op, dtype, size, n, salt=n), dtype, f"{dtype.name} {op} n={n}")


def test_allreduce_16mb(rank, size):
    n = (16 << 20) // 4 + 5  # 16 MB of float32, odd: 1 MiB pieces, uneven blocks
    x = values(rank, n).astype(np.float32) * (rank + 1)
    got = hvd.allreduce(tf.constant(x), op=hvd.Sum).numpy()
    want = sum(values(r, n).astype(np.float64) * (r + 1) for r in range(size))
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_allreduce_in_function_fused(rank, size):
    """Several tensors fused into one buffer, and scale factors, in a tf.function."""
    shapes = [(3,), (1000, 3), (17, 17), (1,), (70001,)]

    @tf.function
    def step(xs):
        return [hvd.allreduce(x, op=hvd.Sum) for x in xs] + [
            hvd.allreduce(xs[1], op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)]

    xs = [tf.constant(values(rank, int(np.prod(s)), salt=i).reshape(s), tf.float32)
          for i, s in enumerate(shapes)]
    out = step(xs)
    for i, s in enumerate(shapes):
        want = expected("sum", tf.float32, size, int(np.prod(s)), salt=i).reshape(s)
        check(out[i], want, tf.float32, f"fused {s}")
    check(out[-1], expected("average", tf.float32, size, 3000, salt=1).reshape(1000, 3),
          tf.float32, "scaled average")


@pytest.mark.parametrize("dtype", [tf.uint8, tf.float16, tf.float64, tf.bool])
def test_allgather_different_rows(rank, size, dtype):
    for cols in (3, 40001):  # small, and ~1.2 MB per rank: several pieces per block
        for rows_of in (lambda r: r + 1, lambda r: 0 if r == 1 else 2 * r + 1):
            rows = rows_of(rank)
            x = values(rank, rows * cols, dtype).reshape(rows, cols)
            got = hvd.allgather(tf.constant(x, dtype=dtype)).numpy()
            want = np.concatenate([values(r, rows_of(r) * cols, dtype).reshape(rows_of(r), cols)
                                   for r in range(size)])
            assert got.shape == want.shape
            np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64),
                                          err_msg=f"{dtype.name} cols={cols}")


def test_broadcast_from_every_root(rank, size):
    for root in range(size):
        for n, dtype in ((1, tf.int32), (1001, tf.float16), ((3 << 20) // 8 + 3, tf.float64)):
            x = values(rank, n, dtype, salt=root) * (rank + 1)
            got = hvd.broadcast(tf.constant(x, dtype=dtype), root_rank=root).numpy()
            want = values(root, n, dtype, salt=root) * (root + 1)
            check(got, want.astype(np.float64), dtype, f"root {root} n={n}")


@pytest.mark.parametrize("dtype", [tf.int32, tf.float16, tf.float32, tf.float64])
def test_reducescatter_uneven(rank, size, dtype):
    for rows, cols in ((2 * size + 1, 3), (size - 1, 2), (5 * size + 2, 20001)):
        counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
        begin = sum(counts[:rank])
        for op in ("sum", "average", "min", "max", "product"):
            x = values(rank, rows * cols, dtype).reshape(rows, cols)
            got = hvd.reducescatter(tf.constant(x, dtype=dtype), op=OPS[op]).numpy()
            want = expected(op, dtype, size, rows * cols).reshape(rows, cols)
            check(got, want[begin:begin + counts[rank]], dtype, f"rows={rows} {op}")


def test_alltoall_and_barrier(rank, size):
    splits = [(rank + j) % 2 + 1 for j in range(size)]
    x = np.concatenate([np.full([s, 2], rank * 10 + j) for j, s in enumerate(splits)])
    got = hvd.alltoall(tf.constant(x, tf.int32), splits=splits)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = np.concatenate([np.full([(r + rank) % 2 + 1, 2], r * 10 + rank) for r in range(size)])
    np.testing.assert_array_equal(got.numpy(), want)
    hvd.barrier()


@pytest.mark.parametrize("members", ["first_and_last", "first_two"])
def test_process_set(rank, size, members):
    """A subset: ranks 0 and size-1 (on different fake hosts), or 0 and 1 (one host)."""
    ranks = [0, size - 1] if members == "first_and_last" else [0, 1]
    ps = hvd.add_process_set(ranks)
    try:
        if rank in ranks:
            sub = ranks.index(rank)
            n = 3 * 65536 + 7
            for op in ("sum", "max", "product"):
                got = hvd.allreduce(tf.constant(values(rank, n), tf.float32), op=OPS[op],
                                    process_set=ps).numpy()
                xs = np.stack([values(r, n) for r in ranks]).astype(np.float64)
                want = {"sum": xs.sum(0), "max": xs.max(0), "product": xs.prod(0)}[op]
                check(got, want, tf.float32, f"set {ranks} {op}")
            got = hvd.allgather(tf.fill([sub + 1, 2], rank), process_set=ps).numpy()
            want = np.concatenate([np.full([i + 1, 2], r) for i, r in enumerate(ranks)])
            np.testing.assert_array_equal(got, want)
            # root_rank is job-wide (as in Horovod): the set's second member.
            got = hvd.broadcast(tf.constant(values(rank, 1001) * (rank + 1), tf.int64),
                                root_rank=ranks[1], process_set=ps).numpy()
            np.testing.assert_array_equal(got, values(ranks[1], 1001) * (ranks[1] + 1))
            x = values(rank, 5 * 4).reshape(5, 4)
            got = hvd.reducescatter(tf.constant(x, tf.float32), op=hvd.Sum,
                                    process_set=ps).numpy()
            full = sum(values(r, 20).reshape(5, 4) for r in ranks)
            np.testing.assert_array_equal(got, full[:3] if sub == 0 else full[3:])
        # The global set keeps working alongside.
        assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy() == size
    finally:
        assert hvd.remove_process_set(ps)
