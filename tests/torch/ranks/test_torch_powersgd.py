"""PowerSGD in tfring.torch's DistributedOptimizer: exact where the
average is of low rank, uncompressed before start_step, error feedback that
loses nothing, training close to uncompressed, and its state through a
checkpoint and tfring.torch.elastic's TorchState."""
import copy

import pytest
import torch

import tfring.torch as hvd
from tfring.torch.elastic import TorchState


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _one_matrix(**settings):
    w = torch.nn.Parameter(torch.zeros(8, 6, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0), named_parameters=[("w", w)],
                                   compression=hvd.Compression.powersgd(**settings))
    return w, opt


def _reduce(w, opt, grad):
    w.grad = grad.clone()
    opt.synchronize()
    return w.grad.clone()


def _every_rank(size, make):
    return torch.stack([make(r) for r in range(size)])


def _needs_peers(size):
    if size == 1:
        pytest.skip("alone, the optimizer reduces nothing, so PowerSGD never runs "
                    "(test_uncompressed_before_start_step_then_approximated checks that)")


def test_average_of_rank_one_gradients_is_exact(rank, size):
    u = torch.arange(1.0, 9.0, dtype=torch.float64)

    def grad(r):
        return torch.outer(u, torch.randn(6, generator=_generator(r), dtype=torch.float64))
    w, opt = _one_matrix(rank=1, start_step=0)
    out = _reduce(w, opt, grad(rank))
    torch.testing.assert_close(out, _every_rank(size, grad).mean(0), rtol=1e-10, atol=1e-10)


def test_uncompressed_before_start_step_then_approximated(rank, size):
    def grad(r):
        return torch.randn(8, 6, generator=_generator(r), dtype=torch.float64)
    average = _every_rank(size, grad).mean(0)
    w, opt = _one_matrix(rank=1, start_step=1)
    torch.testing.assert_close(_reduce(w, opt, grad(rank)), average, rtol=1e-12, atol=1e-12)
    approx = _reduce(w, opt, grad(rank))
    if size == 1:
        # Alone, the optimizer reduces nothing (as Horovod's), so nothing
        # is compressed either.
        torch.testing.assert_close(approx, average, rtol=0, atol=0)
        return
    assert torch.linalg.matrix_rank(approx) == 1
    assert not torch.allclose(approx, average, atol=1e-3)


def test_error_feedback_keeps_what_the_approximation_missed(rank, size):
    """Over k steps of the same gradients, the approximations sent plus the
    ranks' mean residual are exactly k times the average: nothing is lost."""
    _needs_peers(size)
    def grad(r):
        return torch.randn(8, 6, generator=_generator(r), dtype=torch.float64)
    w, opt = _one_matrix(rank=1, start_step=0)
    total = sum(_reduce(w, opt, grad(rank)) for _ in range(5))
    error = opt._compression.errors["w"]
    assert error.abs().max() > 1e-3
    mean_error = hvd.allreduce(error, op=hvd.Average)
    torch.testing.assert_close(total + mean_error, 5 * _every_rank(size, grad).mean(0),
                               rtol=1e-10, atol=1e-10)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 1)).double()


def _data(size):
    g = _generator(3)
    x = torch.randn(size * 8, 16, generator=g, dtype=torch.float64)
    return x, torch.sin(x[:, :1] * 2) + x[:, 1:2]


def _train(model, opt, x, y, rows, steps):
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        opt.step()
    return torch.nn.functional.mse_loss(model(x), y).item()


def _powersgd_optimizer(model, **settings):
    return hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
        compression=hvd.Compression.powersgd(**settings))


def test_training_close_to_uncompressed(rank, size):
    """Stated tolerance: after 60 steps (rank 2, compressed from step 6) the
    full-batch loss is within 0.01 of one process's on the whole batch
    without compression, having started at about 1."""
    x, y = _data(size)
    reference = _model()
    ref_loss = _train(reference, torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9),
                      x, y, slice(None), 60)
    model = _model()
    opt = _powersgd_optimizer(model, rank=2, start_step=5)
    loss = _train(model, opt, x, y, slice(rank * 8, rank * 8 + 8), 60)
    first = torch.nn.functional.mse_loss(_model()(x), y).item()
    assert first > 0.5 and abs(loss - ref_loss) < 0.01, (first, loss, ref_loss)


@pytest.mark.parametrize("with_state", [True, False], ids=["with_state", "without"])
def test_checkpoint_resumes_the_same_training(rank, size, with_state):
    """Training on from a state_dict() gives the weights training straight
    through gives; dropping the compressor's state does not."""
    _needs_peers(size)
    x, y = _data(size)
    rows = slice(rank * 8, rank * 8 + 8)
    model = _model()
    opt = _powersgd_optimizer(model, rank=1, start_step=1)
    _train(model, opt, x, y, rows, 3)
    saved = copy.deepcopy((model.state_dict(), opt.state_dict()))
    assert saved[1]["tfring_compression"]["step"] == 3
    _train(model, opt, x, y, rows, 3)
    straight = [p.detach().clone() for p in model.parameters()]

    resumed = _model()
    opt2 = _powersgd_optimizer(resumed, rank=1, start_step=1, seed=7)
    resumed.load_state_dict(saved[0])
    if not with_state:
        saved[1].pop("tfring_compression")
    opt2.load_state_dict(saved[1])
    _train(resumed, opt2, x, y, rows, 3)
    same = all(torch.equal(a, b) for a, b in zip(straight, resumed.parameters()))
    assert same == with_state


def test_state_through_an_elastic_reset(rank, size):
    """TorchState's save/restore brings back the step, Q and this rank's
    error feedback; sync gives every rank rank 0's step and Q and drops the
    error feedback on the others (theirs is not rank 0's)."""
    _needs_peers(size)
    x, y = _data(size)
    rows = slice(rank * 8, rank * 8 + 8)
    model = _model()
    opt = _powersgd_optimizer(model, rank=1, start_step=0)
    _train(model, opt, x, y, rows, 2)
    state = TorchState(model=model, optimizer=opt)
    compressor = opt._compression
    saved_q = {k: v.clone() for k, v in compressor.qs.items()}
    saved_e = {k: v.clone() for k, v in compressor.errors.items()}
    _train(model, opt, x, y, rows, 2)
    assert compressor.step == 4
    state.restore()
    assert compressor.step == 2
    for k in saved_q:
        assert torch.equal(compressor.qs[k], saved_q[k])
        assert torch.equal(compressor.errors[k], saved_e[k])
    state.sync()
    assert compressor.step == 2
    for k, q in compressor.qs.items():
        gathered = hvd.allgather(q.reshape(1, -1))
        assert torch.equal(gathered, gathered[:1].expand_as(gathered)), k
    assert bool(compressor.errors) == (rank == 0)


def test_bad_powersgd_settings_are_refused_at_construction(rank, size):
    model = _model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad, error in (({"rank": 0}, ValueError), ({"start_step": -1}, ValueError),
                       ({"rank": 1.5}, TypeError), ({"min_compression_rate": 0.5}, ValueError)):
        with pytest.raises(error, match="Compression.powersgd"):
            hvd.Compression.powersgd(**bad)
    with pytest.raises(TypeError, match="must be called"):
        hvd.DistributedOptimizer(sgd, compression=hvd.Compression.powersgd)
    with pytest.raises(ValueError, match="op=Average"):
        hvd.DistributedOptimizer(sgd, compression=hvd.Compression.powersgd(), op=hvd.Sum)
    with pytest.raises(TypeError, match="not to a collective"):
        hvd.allreduce(torch.ones(2), compression=hvd.Compression.powersgd())
