"""DistributedOptimizer and SyncBatchNorm: N ranks, each with b rows of every
batch, end with the weights of one process training on all N*b rows."""
import pytest
import torch

import tfring.torch as hvd

STEPS, ROWS = 3, 4   # steps, and rows per rank per (micro-)batch


def _model(sync_bn=False, bn=False, dtype=torch.float64):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(5, 8)]
    if sync_bn:
        layers.append(hvd.SyncBatchNorm(8))
    elif bn:
        layers.append(torch.nn.BatchNorm1d(8))
    layers += [torch.nn.Tanh(), torch.nn.Linear(8, 1)]
    return torch.nn.Sequential(*layers).to(dtype)


def _batches(size, passes, dtype):
    """Per step and pass: the global batch (size*ROWS rows, rank r's are the
    r-th ROWS)."""
    g = torch.Generator().manual_seed(1)
    return [[(torch.randn(size * ROWS, 5, generator=g, dtype=dtype),
              torch.randn(size * ROWS, 1, generator=g, dtype=dtype)) for _ in range(passes)]
            for _ in range(STEPS)]


def _train(model, opt, batches, rows):
    for step in batches:
        opt.zero_grad()
        for x, y in step:
            torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    return model


def _check(make_opt, rank, size, passes=1, tol=1e-5, dtype=torch.float64, sync_bn=False,
           **kwargs):
    batches = _batches(size, passes, dtype)
    reference = _model(bn=sync_bn, dtype=dtype)
    _train(reference, make_opt(reference.parameters()), batches, slice(None))
    model = _model(sync_bn=sync_bn, dtype=dtype)
    if callable(kwargs.get("groups")):
        kwargs["groups"] = kwargs["groups"](model)
    opt = hvd.DistributedOptimizer(make_opt(model.parameters()),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    _train(model, opt, batches, slice(rank * ROWS, (rank + 1) * ROWS))
    expected = reference.state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.double(), expected[name].double(), rtol=tol, atol=tol,
                                   msg=name)


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


@pytest.mark.parametrize("make_opt", [sgd, adam])
def test_equivalence(make_opt, rank, size):
    _check(make_opt, rank, size)


def test_equivalence_with_two_backward_passes_per_step(rank, size):
    _check(sgd, rank, size, passes=2)


@pytest.mark.parametrize("groups", [2, "first layer"])
def test_equivalence_with_groups(groups, rank, size):
    if groups == "first layer":
        def groups(model):
            return [list(model[0].parameters())]
    _check(sgd, rank, size, groups=groups)


# Gradients travel rounded to 11 (fp16) or 8 (bf16) bits of mantissa.
@pytest.mark.parametrize("name,tol", [("fp16", 2e-3), ("bf16", 2e-2)])
def test_equivalence_with_16bit_compression(name, tol, rank, size):
    _check(sgd, rank, size, dtype=torch.float32, tol=tol,
           compression=getattr(hvd.Compression, name))


def test_equivalence_with_predivide_factor(rank, size):
    _check(adam, rank, size, gradient_predivide_factor=2.0)


def test_sync_batch_norm_equals_batch_norm_on_the_full_batch(rank, size):
    _check(sgd, rank, size, sync_bn=True)


def test_synchronize_then_skip_synchronize(rank, size):
    model = _model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()))
    x = torch.full((2, 5), float(rank + 1), dtype=torch.float64)
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        if size > 1:
            opt.zero_grad()
        else:
            raise AssertionError("zero_grad: nothing pending at one rank")
    opt.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    for g in grads:
        gathered = hvd.allgather(g.reshape(1, -1))
        assert torch.equal(gathered, gathered[:1].expand_as(gathered))
    with opt.skip_synchronize():
        opt.step()
    assert isinstance(opt, torch.optim.SGD)
    model(x).sum().backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="second time"):
        opt.step()


def test_a_loaded_state_drops_the_step_under_way(rank, size):
    """As an elastic reset restores the optimizer after a failure that
    interrupted backward(): the reductions its hooks started are dropped,
    and training goes on from the loaded state."""
    model = _model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()),
                                   named_parameters=model.named_parameters())
    x = torch.full((2, 5), float(rank + 1), dtype=torch.float64)
    model(x).sum().backward()  # at np > 1 the hooks start the reductions
    opt.load_state_dict(opt.state_dict())
    opt.zero_grad()  # no step pending any more
    model(x).sum().backward()
    opt.step()
    for p in model.parameters():
        gathered = hvd.allgather(p.detach().reshape(1, -1))
        assert torch.equal(gathered, gathered[:1].expand_as(gathered))


def test_sparse_gradients_are_reduced_as_sparse_by_default(rank, size):
    """An embedding with sparse gradients trains like one process on the
    full batch, without sparse_as_dense: the gradients travel as indices
    and values (Horovod's default) and stay sparse."""
    torch.manual_seed(0)
    reference = torch.nn.Embedding(6, 3, sparse=True).double()
    model = torch.nn.Embedding(6, 3, sparse=True).double()
    model.load_state_dict(reference.state_dict())
    ids = torch.arange(size * 2) % 6
    torch.nn.functional.embedding(ids, reference.weight).pow(2).mean().backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters())
    model(ids[2 * rank:2 * rank + 2]).pow(2).mean().backward()
    opt.step()
    assert model.weight.grad.is_sparse
    torch.testing.assert_close(model.weight, reference.weight)


def test_sparse_allreduce_async_is_horovods_callable(rank, size):
    dense = torch.zeros(4, 2, dtype=torch.float64)
    dense[rank % 4] = rank + 1
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), "sparse_callable", hvd.Sum)
    out = handle()
    expected = torch.zeros(4, 2, dtype=torch.float64)
    for r in range(size):
        expected[r % 4] += r + 1
    assert out.is_sparse and torch.equal(out.to_dense(), expected)


def test_broadcast_optimizer_state_with_params_without_grad_or_state(rank, size):
    """As Horovod: a fresh optimizer gets zero gradients for its trainable
    parameters and its state; a frozen parameter keeps grad None."""
    torch.manual_seed(rank)
    frozen = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    trained = torch.nn.Parameter(torch.rand(4))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([frozen, trained], lr=0.1, momentum=0.9),
                                   named_parameters=[("frozen", frozen), ("trained", trained)])
    hvd.broadcast_parameters({"frozen": frozen, "trained": trained}, root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert frozen.grad is None
    assert torch.equal(trained.grad, torch.zeros(4))
    momentum = opt.state[trained]["momentum_buffer"]
    gathered = hvd.allgather(momentum.view(1, -1))
    assert torch.equal(gathered, gathered[:1].expand_as(gathered))


def test_optimizer_on_a_process_set_leaves_other_ranks_alone(partial_set, rank, size):
    """Only the set's ranks average; a rank outside steps on its own
    gradients and takes part in nothing."""
    model = torch.nn.Linear(3, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters(),
                                   process_set=partial_set)
    model(torch.full((1, 3), float(rank), dtype=torch.float64)).sum().backward()
    opt.step()
    members = partial_set.ranks
    grad = sum(members) / len(members) if rank in members else rank
    assert torch.equal(model.weight, torch.full((1, 3), 1.0 - grad, dtype=torch.float64))
