"""Every collective of tfring.torch x dtype, with Horovod's arguments: the
blocking, async and in-place forms, out-of-order polling, and gradients."""
import pytest
import torch

import tfring.torch as hvd
from torch_helpers import MOVABLE, REDUCIBLE, assert_close, every_rank, rank_values

REDUCTIONS = {
    hvd.Sum: lambda xs, n: xs.sum(0),
    hvd.Average: lambda xs, n: xs.sum(0) / n,
    hvd.Min: lambda xs, n: xs.min(0).values,
    hvd.Max: lambda xs, n: xs.max(0).values,
    hvd.Product: lambda xs, n: xs.prod(0),
}


def _expected(op, size, dtype, shape=(3, 4)):
    out = REDUCTIONS[op](every_rank(size, shape), size)
    if op == hvd.Average and not dtype.is_floating_point:
        out = torch.floor(out)
    return out


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", list(REDUCTIONS), ids=["sum", "average", "min", "max", "product"])
def test_allreduce_every_op(dtype, op, rank, size):
    out = hvd.allreduce(rank_values(rank, dtype=dtype), op=op)
    assert_close(out, _expected(op, size, dtype), dtype, f"allreduce op={op}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_allreduce_scale_factors_and_fp16_compression(dtype, rank, size):
    x = rank_values(rank, dtype=dtype)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0,
                        compression=hvd.Compression.fp16)
    assert_close(out, every_rank(size).sum(0) * 1.5, dtype, "scaled fp16")


@pytest.mark.parametrize("name,big", [("fp16", 60000.0), ("bf16", 2.0e38)])
def test_16bit_compression_divides_before_the_sum(name, big, rank, size):
    """Each rank's value fits the 16-bit type, their sum does not (nor, for
    bf16, float32's); the average does. Multiples of size are exact after
    the division, so their average is bit-exact."""
    compression = getattr(hvd.Compression, name)
    out = hvd.allreduce(torch.full((3,), big), compression=compression)
    torch.testing.assert_close(out, torch.full((3,), big), rtol=1e-2, atol=0)
    v = torch.tensor([1.0, 0.5, 2.0 ** -10, 384.0])
    x = size * (rank + 1) * v
    exact = hvd.grouped_allreduce([x], compression=compression)[0]
    assert torch.equal(exact, v * (size * (size + 1) // 2)), exact
    opt_grad = torch.nn.Parameter(torch.zeros(4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([opt_grad], lr=1.0), compression=compression)
    opt_grad.grad = x.clone()
    opt.synchronize()
    assert torch.equal(opt_grad.grad, v * (size * (size + 1) // 2)), opt_grad.grad


def test_average_argument_is_horovods_deprecated_spelling(rank, size):
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(rank_values(rank), average=False)
    assert_close(out, every_rank(size).sum(0), torch.float64, "average=False")
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(rank_values(rank), average=True, op=hvd.Sum)


def test_in_place_variants_write_into_the_input(rank, size):
    x = rank_values(rank, dtype=torch.float32)
    assert hvd.allreduce_(x, op=hvd.Sum) is x
    assert_close(x, every_rank(size).sum(0), torch.float32, "allreduce_")
    xs = [rank_values(rank, (2,)), rank_values(rank, (5,), torch.int64)]
    out = hvd.grouped_allreduce_(xs, op=hvd.Sum)
    assert all(o is x for o, x in zip(out, xs))
    assert_close(xs[1], every_rank(size, (5,)).sum(0), torch.int64, "grouped_allreduce_")
    y = torch.full((3,), float(rank))
    hvd.synchronize(hvd.broadcast_async_(y, root_rank=size - 1))
    assert_close(y, torch.full((3,), float(size - 1)), torch.float32, "broadcast_async_")
    y.fill_(rank)
    assert hvd.broadcast_(y, 0) is y and y.tolist() == [0.0] * 3


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
def test_grouped_allreduce_mixed_shapes(dtype, rank, size):
    a, b = hvd.grouped_allreduce([rank_values(rank, (2, 3), dtype), rank_values(rank, (4,), dtype)],
                                 op=hvd.Sum)
    assert_close(a, every_rank(size, (2, 3)).sum(0), dtype, "grouped a")
    assert_close(b, every_rank(size, (4,)).sum(0), dtype, "grouped b")


@pytest.mark.parametrize("dtype", MOVABLE, ids=str)
def test_allgather_ragged(dtype, rank, size):
    out = hvd.allgather(rank_values(rank, (rank + 1, 2), dtype))
    expected = torch.cat([rank_values(r, (r + 1, 2), dtype) for r in range(size)])
    assert out.dtype == dtype and torch.equal(out, expected)


def test_grouped_allgather(rank, size):
    rows, ids = hvd.grouped_allgather([torch.full((rank + 1, 2), float(rank)),
                                       torch.tensor([rank], dtype=torch.int64)])
    assert rows.shape == (size * (size + 1) // 2, 2)
    assert ids.tolist() == list(range(size))


@pytest.mark.parametrize("dtype", MOVABLE, ids=str)
def test_broadcast_from_every_root(dtype, rank, size):
    for root in range(size):
        out = hvd.broadcast(rank_values(rank, dtype=dtype), root_rank=root)
        assert torch.equal(out, rank_values(root, dtype=dtype)), root


@pytest.mark.parametrize("dtype", MOVABLE, ids=str)
def test_alltoall_with_splits_returns_received_splits(dtype, rank, size):
    # Rank r sends j+1 rows to rank j, each row holding r.
    splits = [j + 1 for j in range(size)]
    x = torch.cat([torch.full((j + 1, 2), rank) for j in range(size)]).to(dtype)
    out, received = hvd.alltoall(x, splits=splits)
    assert received.dtype == torch.int32 and received.tolist() == [rank + 1] * size
    expected = torch.cat([torch.full((rank + 1, 2), r) for r in range(size)]).to(dtype)
    assert torch.equal(out, expected)
    even = hvd.alltoall(torch.full((size, 1), rank).to(dtype))
    assert torch.equal(even, torch.arange(size).reshape(size, 1).to(dtype))


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_uneven_rows(dtype, op, rank, size):
    rows = 2 * size + 1
    out = hvd.reducescatter(rank_values(rank, (rows, 2), dtype), op=op)
    full = _expected(op, size, dtype, (rows, 2))
    start = sum(rows // size + (1 if r < rows % size else 0) for r in range(rank))
    assert_close(out, full[start:start + out.shape[0]], dtype, "reducescatter")
    assert out.shape[0] == rows // size + (1 if rank < rows % size else 0)


def test_grouped_reducescatter(rank, size):
    a, b = hvd.grouped_reducescatter([torch.ones(2 * size, 3), torch.ones(size, dtype=torch.int32)],
                                     op=hvd.Sum)
    assert torch.equal(a, torch.full((2, 3), float(size)))
    assert torch.equal(b, torch.full((1,), size, dtype=torch.int32))


def test_async_handles_polled_out_of_order(rank, size):
    handles = [
        ("gather", hvd.allgather_async(torch.full((1,), rank))),
        ("sum", hvd.allreduce_async(torch.ones(4), op=hvd.Sum)),
        ("bcast", hvd.broadcast_async(torch.full((2,), rank), root_rank=0)),
        ("a2a", hvd.alltoall_async(torch.full((size,), rank))),
        ("rs", hvd.reducescatter_async(torch.ones(size), op=hvd.Sum)),
        ("group", hvd.grouped_allreduce_async([torch.ones(1), torch.ones(2)], op=hvd.Sum)),
    ]
    results = {}
    while len(results) < len(handles):
        for tag, h in reversed(handles):
            if tag not in results and hvd.poll(h):
                results[tag] = hvd.synchronize(h)
    assert results["gather"].tolist() == list(range(size))
    assert results["sum"].tolist() == [size] * 4
    assert results["bcast"].tolist() == [0, 0]
    out, received = results["a2a"]
    assert out.tolist() == list(range(size)) and received.tolist() == [1] * size
    assert results["rs"].tolist() == [size]
    assert [t.tolist() for t in results["group"]] == [[size], [size] * 2]
    with pytest.raises(ValueError, match="not a pending"):
        hvd.synchronize(handles[0][1])


def test_gradients_flow_through_the_collectives(rank, size):
    """Each backward is the collective Horovod uses, on the sum of every
    rank's loss."""
    x = torch.full((size, 2), float(rank + 1), requires_grad=True)
    hvd.allreduce(x, op=hvd.Sum).sum().backward()
    assert torch.equal(x.grad, torch.full((size, 2), float(size)))

    x.grad = None
    g = hvd.allgather(x)
    (g * torch.arange(g.shape[0]).view(-1, 1)).sum().backward()
    # Averaged over the ranks, then this rank's rows: row index of its rows.
    assert torch.equal(x.grad, torch.arange(rank * size, (rank + 1) * size).view(-1, 1)
                       .expand(size, 2).float())

    x.grad = None
    hvd.broadcast(x, root_rank=0).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 1.0 if rank == 0 else 0.0))

    x.grad = None
    out = hvd.alltoall(x * (rank + 1))
    (out * 2).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0 * (rank + 1)))

    x.grad = None
    hvd.reducescatter(x, op=hvd.Average).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # Horovod's: not divided by size


def test_objects_and_parameters(rank, size):
    assert hvd.broadcast_object({"from": rank, "f": lambda v: v + 1}, root_rank=size - 1)["from"] \
        == size - 1
    assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for name, p in model.state_dict().items():
        gathered = hvd.allgather(p.reshape(1, -1).float())
        assert torch.equal(gathered, gathered[:1].expand_as(gathered)), name
    opt = torch.optim.Adam(model.parameters(), lr=0.1 * (rank + 1))
    if rank == 0:
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    state = opt.state[opt.param_groups[0]["params"][0]]
    gathered = hvd.allgather(state["exp_avg"].reshape(1, -1))
    assert torch.equal(gathered, gathered[:1].expand_as(gathered))


def test_join_and_barrier(rank, size):
    hvd.barrier()
    assert 0 <= hvd.join() < size


def test_process_sets(partial_set, rank):
    if not partial_set.included():
        return
    members = partial_set.ranks
    out = hvd.allreduce(torch.full((2,), rank), op=hvd.Sum, process_set=partial_set)
    assert out.tolist() == [sum(members)] * 2
    assert hvd.allgather_object(rank, process_set=partial_set) == members


def test_topology(rank, size):
    assert hvd.is_initialized() and hvd.size() == size and 0 <= hvd.local_rank() < size
    assert hvd.local_size() * hvd.cross_size() == size and hvd.is_homogeneous()
    assert hvd.gloo_built() and hvd.mpi_enabled() != hvd.gloo_enabled()


def test_sparse_allreduce_async(rank, size):
    # Rank r holds the value r+1 at row r % 2 of a 2x3 tensor.
    dense = torch.zeros(2, 3)
    dense[rank % 2, 1] = rank + 1
    out = hvd.synchronize(hvd.sparse_allreduce_async(dense.to_sparse(), op=hvd.Sum))
    expected = torch.zeros(2, 3)
    for r in range(size):
        expected[r % 2, 1] += r + 1
    assert out.is_sparse and torch.equal(out.to_dense(), expected)
    avg = hvd.synchronize(hvd.sparse_allreduce_async(dense.to_sparse()))
    assert torch.allclose(avg.to_dense(), expected / size)


# Horovod's scaling rule: a factor is applied once, in float64 for integers,
# in float32 for 16-bit floats (on the CPU), in the tensor's own type for
# float32 and float64; the result is rounded (integers truncated) to the dtype.
SCALED_IN = {torch.int32: torch.float64, torch.int64: torch.float64,
             torch.float16: torch.float32, torch.bfloat16: torch.float32,
             torch.float32: torch.float32, torch.float64: torch.float64}
# Not representable in float32, so scaling in double and in float differ.
FACTOR = 0.1915194503788923


def _scaled(x, dtype):
    math = SCALED_IN[dtype]
    return (x.to(math) * torch.tensor(FACTOR, dtype=torch.float64).to(math)).to(dtype)


def _same_on_every_rank(dtype, rows):
    torch.manual_seed(1234)
    return torch.empty(rows, 5).random_(-100, 100).to(dtype)


@pytest.mark.parametrize("dtype", list(SCALED_IN), ids=str)
def test_scale_factors_follow_horovods_rule(dtype, rank, size):
    x = _same_on_every_rank(dtype, 2 * size)
    summed = (x.to(torch.float64) * size).to(dtype)  # exact: small integers
    pre = (_scaled(x, dtype).to(torch.float64) * size).to(dtype)
    post = _scaled(summed, dtype)
    mine = slice(2 * rank, 2 * rank + 2)
    for what, out, expected in [
        ("allreduce prescale", hvd.allreduce(x, op=hvd.Sum, prescale_factor=FACTOR), pre),
        ("allreduce postscale", hvd.allreduce(x, op=hvd.Sum, postscale_factor=FACTOR), post),
        ("reducescatter prescale",
         hvd.reducescatter(x, op=hvd.Sum, prescale_factor=FACTOR), pre[mine]),
        ("reducescatter postscale",
         hvd.reducescatter(x, op=hvd.Sum, postscale_factor=FACTOR), post[mine]),
        ("grouped reducescatter postscale",
         hvd.grouped_reducescatter([x], op=hvd.Sum, postscale_factor=FACTOR)[0], post[mine]),
    ]:
        assert out.dtype == dtype and torch.equal(out, expected), \
            f"{what} {dtype}: {out.flatten()[:4]} vs {expected.flatten()[:4]}"


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_gradient_is_horovods(op, rank, size):
    """Horovod's reducescatter gradient: the allgathered gradient, times the
    set's size for Sum (once for Average), times the scale factors."""
    x = torch.ones(2 * size, 3, requires_grad=True)
    hvd.reducescatter(x, op=op, prescale_factor=0.5, postscale_factor=3.0).sum().backward()
    scale = 1.5 * (size if op == hvd.Sum else 1)
    assert torch.equal(x.grad, torch.full_like(x, scale))
    xs = [torch.ones(size, requires_grad=True), torch.ones(2 * size, 2, requires_grad=True)]
    a, b = hvd.grouped_reducescatter(xs, op=op)
    (a.sum() + 2 * b.sum()).backward()
    unit = size if op == hvd.Sum else 1
    assert torch.equal(xs[0].grad, torch.full_like(xs[0], unit))
    assert torch.equal(xs[1].grad, torch.full_like(xs[1], 2 * unit))


def test_reducescatter_first_dimension_smaller_than_the_ranks(rank, size):
    out = hvd.reducescatter(torch.ones(1, 3), op=hvd.Sum)
    assert out.shape == ((1, 3) if rank == 0 else (0, 3))
    assert torch.equal(out, torch.full(out.shape, float(size)))


def test_alltoall_equal_split_gradient_with_ranks_sending_different_rows(rank, size):
    """Without splits each rank sends (rank + 1) rows to every rank: rank j's
    rows it receives number j + 1, and the gradient goes back the same way."""
    x = torch.arange(size).repeat_interleave(rank + 1).float().view(-1, 1).requires_grad_()
    out = hvd.alltoall(x)
    assert out.shape[0] == sum(range(1, size + 1))
    assert out.view(-1).tolist() == [float(rank)] * out.shape[0]
    (out * 3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))
    _, received = hvd.synchronize(hvd.alltoall_async(x.detach()))
    assert received.tolist() == list(range(1, size + 1))
