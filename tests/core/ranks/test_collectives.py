"""Every collective of tfring.core with numpy arrays, every dtype the core
has, checked against numpy's own arithmetic on every rank's known input."""
import numpy as np
import pytest

import tfring.core as hvd
from core_helpers import (BFLOAT16, DTYPES, REDUCTIONS, assert_close, every_rank, is_integer,
                          rank_values)


def expected_reduction(op, dtype, size, shape=(3, 4), prescale=1.0, postscale=1.0):
    xs = every_rank(size, shape)
    if prescale == 1.0 and postscale == 1.0:
        out = REDUCTIONS[op](xs, size)
        return np.trunc(out) if op == hvd.Average and is_integer(dtype) else out
    # Integers: the scaled sum truncates, then the average does.
    total = xs.sum(0) * prescale * postscale
    if is_integer(dtype):
        total = np.trunc(total)
    out = total / (size if op == hvd.Average else 1)
    return np.trunc(out) if is_integer(dtype) else out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(REDUCTIONS), ids=["Average", "Sum", "Min", "Max", "Product"])
def test_allreduce(dtype, op, rank, size):
    out = hvd.allreduce(rank_values(rank, dtype=dtype), op=op, name=f"ar.{dtype}.{op}")
    assert out.shape == (3, 4)
    assert_close(out, expected_reduction(op, dtype, size), dtype, f"op {op}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64),
                                   np.dtype(np.float16), BFLOAT16, np.dtype(np.int32),
                                   np.dtype(np.int64)], ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["Sum", "Average"])
def test_allreduce_scale_factors(dtype, op, rank, size):
    out = hvd.allreduce(rank_values(rank, dtype=dtype), op=op, prescale_factor=3.0,
                        postscale_factor=0.5)
    assert_close(out, expected_reduction(op, dtype, size, prescale=3.0, postscale=0.5), dtype)


def test_allreduce_default_op_is_average_and_input_is_untouched(rank, size):
    x = rank_values(rank, dtype=np.float32)
    before = x.copy()
    out = hvd.allreduce(x)
    assert out is not x
    np.testing.assert_array_equal(x, before)
    assert_close(out, every_rank(size).mean(0), np.dtype(np.float32))


def test_in_place_variants_write_into_their_input(rank, size):
    x = rank_values(rank, dtype=np.float32)
    out = hvd.allreduce_(x, op=hvd.Sum, prescale_factor=2.0)
    assert out is x
    assert_close(x, every_rank(size).sum(0) * 2, np.dtype(np.float32))
    xs = [rank_values(rank, dtype=np.float64), rank_values(rank, (5,), np.int64)]
    outs = hvd.grouped_allreduce_async_(xs, op=hvd.Max).wait()
    assert outs[0] is xs[0] and outs[1] is xs[1]
    assert_close(xs[1], every_rank(size, (5,)).max(0), np.dtype(np.int64))
    y = rank_values(rank, dtype=np.int32)
    assert hvd.broadcast_async_(y, root_rank=size - 1).wait() is y
    np.testing.assert_array_equal(y, rank_values(size - 1, dtype=np.int32))
    # A non-contiguous input is reduced in a contiguous copy, which holds the result.
    z = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2] + rank
    got = hvd.allreduce_(z, op=hvd.Sum)
    base = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(got, base * size + sum(range(size)))


def test_allreduce_bool(rank, size):
    value = np.array([rank == 0, True, False, rank % 2 == 1])
    everyone = np.stack([[r == 0, True, False, r % 2 == 1] for r in range(size)])
    np.testing.assert_array_equal(hvd.allreduce(value, op=hvd.Sum), everyone.any(0))
    np.testing.assert_array_equal(hvd.allreduce(value, op=hvd.Min), everyone.all(0))


def test_allreduce_scalar_and_non_contiguous(rank, size):
    assert hvd.allreduce(np.float64(rank), op=hvd.Sum).item() == sum(range(size))
    x = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2] + rank
    out = hvd.allreduce(x, op=hvd.Sum)
    base = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    np.testing.assert_array_equal(out, base * size + sum(range(size)))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average, hvd.Max], ids=["Sum", "Average", "Max"])
def test_grouped_allreduce(op, rank, size):
    shapes = [(3, 4), (5,), (2, 2, 2), ()]
    dtypes = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), BFLOAT16]
    xs = [rank_values(rank, s, d) for s, d in zip(shapes, dtypes)]
    outs = hvd.grouped_allreduce(xs, op=op, name=f"group.{op}")
    assert len(outs) == len(xs)
    for out, s, d in zip(outs, shapes, dtypes):
        assert out.shape == s
        assert_close(out, expected_reduction(op, d, size, s), d, f"shape {s}")


def test_many_async_allreduces_in_flight_fuse(rank, size):
    handles = [hvd.allreduce_async(rank_values(rank, (7,), np.float32) * i, op=hvd.Sum)
               for i in range(1, 30)]
    total = every_rank(size, (7,)).sum(0)
    for i, h in enumerate(handles, 1):
        out = hvd.synchronize(h)
        assert h.poll()
        np.testing.assert_array_equal(out, total * i)


@pytest.mark.parametrize("dtype", DTYPES + [np.dtype(bool)], ids=str)
def test_allgather_ragged(dtype, rank, size):
    # Rank r sends r + 1 rows (rank 0's two for a 0-row case below).
    x = rank_values(rank, (rank + 1, 3), np.float64).astype(dtype)
    out = hvd.allgather(x, name=f"ag.{dtype}")
    want = np.concatenate([rank_values(r, (r + 1, 3)) for r in range(size)])
    assert out.shape == (size * (size + 1) // 2, 3)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.astype(np.float64), want.astype(dtype).astype(np.float64))


def test_allgather_with_a_rank_sending_no_rows(rank, size):
    rows = 0 if rank == 0 else 2
    out = hvd.allgather(np.full((rows, 2), rank, np.int64))
    want = np.concatenate([np.full((0 if r == 0 else 2, 2), r, np.int64) for r in range(size)])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_from_every_root(dtype, rank, size):
    for root in range(size):
        out = hvd.broadcast(rank_values(rank, dtype=dtype), root, name=f"bc.{dtype}.{root}")
        assert out.dtype == dtype
        np.testing.assert_array_equal(out.astype(np.float64), rank_values(root))


def uneven_splits(sender, size):
    """Rows rank `sender` sends to each rank: uneven, some zero."""
    return [(sender + 2 * dest) % 3 for dest in range(size)]


def rows_for(sender, dest, size, cols=2):
    """What `sender` sends to `dest`: rows tagged with both ranks."""
    n = uneven_splits(sender, size)[dest]
    return np.full((n, cols), 100 * sender + dest, np.float64) + np.arange(n)[:, None]


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.int64),
                                   np.dtype(np.uint8), np.dtype(np.float16), BFLOAT16], ids=str)
def test_alltoall_uneven_splits(dtype, rank, size):
    x = np.concatenate([rows_for(rank, d, size) for d in range(size)]).astype(dtype)
    out, received = hvd.alltoall(x, splits=uneven_splits(rank, size), name=f"a2a.{dtype}")
    want = np.concatenate([rows_for(s, rank, size) for s in range(size)]).astype(dtype)
    np.testing.assert_array_equal(received, [uneven_splits(s, size)[rank] for s in range(size)])
    assert received.dtype == np.int32
    assert out.dtype == dtype
    np.testing.assert_array_equal(out.astype(np.float64), want.astype(np.float64))


def test_alltoall_even_without_splits(rank, size):
    x = np.arange(size * 2, dtype=np.int32).reshape(size * 2, 1) + 1000 * rank
    out = hvd.alltoall(x)
    want = np.concatenate([np.arange(size * 2, dtype=np.int32).reshape(-1, 1)[2 * rank:2 * rank + 2]
                           + 1000 * s for s in range(size)])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32),
                                   np.dtype(np.int64), np.dtype(np.float16), BFLOAT16,
                                   np.dtype(np.uint8)], ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average, hvd.Max], ids=["Sum", "Average", "Max"])
def test_reducescatter(dtype, op, rank, size):
    rows = 2 * size + 1  # uneven: the first ranks get one row more
    out = hvd.reducescatter(rank_values(rank, (rows, 3), dtype), op=op, name=f"rs.{dtype}.{op}")
    full = expected_reduction(op, dtype, size, (rows, 3))
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    assert out.shape == (counts[rank], 3)
    assert_close(out, full[start:start + counts[rank]], dtype)


def test_reducescatter_scale_factors(rank, size):
    out = hvd.reducescatter(rank_values(rank, (size * 2, 2), np.float64), op=hvd.Sum,
                            prescale_factor=2.0, postscale_factor=0.25)
    full = every_rank(size, (size * 2, 2)).sum(0) * 0.5
    np.testing.assert_allclose(out, full[2 * rank:2 * rank + 2])


def test_async_variants_and_handles(rank, size):
    h = hvd.allgather_async(np.full((1,), rank, np.int32))
    assert h.wait(timeout=60).tolist() == list(range(size))
    assert h.wait().tolist() == list(range(size))  # a second wait returns the same
    b = hvd.broadcast_async(np.full(2, rank, np.float32), root_rank=size - 1)
    np.testing.assert_array_equal(hvd.synchronize(b), [size - 1] * 2)
    r = hvd.reducescatter_async(np.ones((size, 1)), op=hvd.Sum)
    np.testing.assert_array_equal(r.wait(), [[size]])
    a = hvd.alltoall_async(np.arange(size, dtype=np.int64) + 10 * rank, splits=[1] * size)
    out, received = a.wait()
    np.testing.assert_array_equal(out, [rank + 10 * s for s in range(size)])
    np.testing.assert_array_equal(received, [1] * size)


def test_barrier_and_join(rank, size):
    hvd.barrier()
    assert 0 <= hvd.join() < size


def test_topology(rank, size):
    assert 0 <= rank < size
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    assert hvd.is_initialized()
    assert hvd.nccl_built() or not hvd.gpu_built()


def test_numpy_calls_submit_in_one_call_with_interned_names(rank, size):
    # The steady state (issue 38): a contiguous numpy array goes to the core
    # in one submit_array() call, whose name is converted and copied on its
    # first call only; other arrays take the general path, with its copies.
    from tfring.core import _module, ops
    core = _module.load()
    x = np.arange(6, dtype=np.float32)
    before = core.interned_names()
    for _ in range(3):
        h = hvd.allreduce_async(x, op=hvd.Sum, name="core.interned.once")
        assert isinstance(h, ops._ArrayHandle)
        np.testing.assert_array_equal(h.wait(), x * size)
    assert core.interned_names() == before + 1
    hvd.allreduce(x, op=hvd.Sum)  # a numbered default name is never interned
    assert hvd.allgather(x[:2], name="core.interned.ag").tolist() == [0, 1] * size
    assert core.interned_names() == before + 2
    strided = hvd.allreduce_async(x[::2], op=hvd.Sum, name="core.interned.strided")
    assert not isinstance(strided, ops._ArrayHandle)
    np.testing.assert_array_equal(strided.wait(), x[::2] * size)


class _GpuLike:
    """A GPU array as __cuda_array_interface__ describes one (nothing is
    read through its pointer on a build without GPU support)."""

    def __init__(self, shape=(2, 3), typestr="<f4", data=0xdead0000, read_only=False, stream=7,
                 strides=None, device=0):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (data, read_only), "version": 3,
                                         "strides": strides, "stream": stream}
        if device is not None:
            self.device = type("Device", (), {"id": device})()


def test_gpu_arrays_submit_in_one_call_or_go_the_general_way(rank, size):
    # submit_device() (issue 38) takes a GPU array it can describe whole and
    # gives back None for any other, so that the general path reads it
    # again and names the problem.
    from tfring.core import _module, ops
    core = _module.load()

    def submit(x, out=None, stream=None, collective=ops._ALLREDUCE):
        return core.submit_device(collective, x, x if out is None else out, stream,
                                  "core.gpu.like", True, 0, hvd.Sum, 1.0, 1.0, 0)

    for declined in (_GpuLike(strides=(12, 4)), _GpuLike(typestr="<c8"), _GpuLike(device=None),
                     _GpuLike(data=0)):
        assert submit(declined) is None, declined.__cuda_array_interface__
    assert submit(_GpuLike(stream=None)) is None  # nobody says which stream made it
    x = _GpuLike()
    assert submit(x, out=_GpuLike(shape=(3, 2))) is None
    assert submit(x, out=_GpuLike(read_only=True)) is None
    assert submit(x, out=_GpuLike(typestr="<f8")) is None
    assert submit(x, out=_GpuLike(device=1)) is None
    assert submit(x, collective=ops._ALLGATHER) is None
    if hvd.gpu_built():
        return  # the GPU machine's tests/gpu/core_worker.py submits real arrays
    # A build without GPU support refuses the array the way the general path
    # does, on every rank, and nothing is left waiting on the others.
    ops._GPU_KINDS[_GpuLike] = lambda x, in_place: (None, x if in_place else _GpuLike())
    try:
        for path in ("one call", "general"):
            with pytest.raises(hvd.InvalidArgumentError, match="GPU") as one:
                hvd.allreduce(_GpuLike(), op=hvd.Sum, name=f"core.gpu.like.{path}")
            ops._GPU_KINDS[_GpuLike] = None
            if path == "one call":
                message = str(one.value)
            else:
                assert str(one.value) == message
        # Refused on one rank only: the others' call fails too, naming it.
        ops._GPU_KINDS[_GpuLike] = lambda x, in_place: (None, x if in_place else _GpuLike())
        x = _GpuLike() if rank == 0 else np.ones((2, 3), np.float32)
        with pytest.raises(hvd.CoreError) as one:
            hvd.allreduce(x, op=hvd.Sum, name="core.gpu.like.rank0")
        if rank != 0:
            assert "rank 0 raised before submitting it" in str(one.value), one.value
    finally:
        ops._GPU_KINDS.pop(_GpuLike, None)
    np.testing.assert_array_equal(hvd.allreduce(np.ones(2), op=hvd.Sum, name="core.gpu.after"),
                                  np.full(2, size))


def test_torch_cpu_tensors_are_not_taken_for_the_gpu_path():
    torch = pytest.importorskip("torch")
    from tfring.core import arrays
    prepare = arrays.one_call_gpu(torch.Tensor)
    assert prepare is not None and prepare(torch.ones(2), False) is None
    assert arrays.one_call_gpu(np.ndarray) is None and arrays.one_call_gpu(list) is None
