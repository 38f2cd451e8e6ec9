"""Compression.powersgd with tfring.keras's DistributedOptimizer in fit():
training close to uncompressed, its state as optimizer variables through a
checkpoint and through TensorFlowKerasState (an elastic reset), under Keras 3
and tf_keras (its optimizers and, where marked, its legacy ones); and PowerSGD
in a train step compiled with XLA."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.keras as hvd
import tfring.tensorflow as hvd_tf
from support import xla_kernels_expected
from tfring.tensorflow.elastic import TensorFlowKerasState

keras = tf.keras
ROWS = 16  # per rank per step


def _data(size, steps):
    rng = np.random.RandomState(3)
    x = rng.randn(size * ROWS * steps, 12).astype("float32")
    return x, (np.sin(2 * x[:, :1]) + x[:, 1:2]).astype("float32")


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(24, activation="tanh"),
                             keras.layers.Dense(1)])


def _fit(model, opt, rank, size, steps, epochs=1, jit_compile=False):
    if getattr(model, "optimizer", None) is None:
        model.compile(optimizer=opt, loss="mse", jit_compile=jit_compile)
    x, y = _data(size, steps)
    # Rank r's rows of every global batch.
    idx = np.concatenate([np.arange(s * size * ROWS + rank * ROWS, s * size * ROWS + (rank + 1)
                                    * ROWS) for s in range(steps)])
    model.fit(x[idx], y[idx], batch_size=ROWS, epochs=epochs, shuffle=False, verbose=0)
    return float(np.mean((model.predict(x, verbose=0) - y) ** 2))


def _sgd(kind="optimizer"):
    optimizers = keras.optimizers.legacy if kind == "legacy" else keras.optimizers
    return optimizers.SGD(0.05, momentum=0.9)


def _powersgd_opt(kind="optimizer", **settings):
    return hvd.DistributedOptimizer(_sgd(kind), compression=hvd.Compression.powersgd(**settings))


@pytest.fixture(params=["optimizer", "legacy"])
def opt_kind(request, legacy_keras):
    if request.param == "legacy" and not legacy_keras:
        # Keras 3 has no legacy optimizers; the flavour is the same on every rank.
        pytest.skip("tf_keras legacy optimizers only")
    return request.param


def _same_on_every_rank(values):
    everyone = hvd_tf.allgather_object([np.asarray(v).tolist() for v in values])
    return all(e == everyone[0] for e in everyone)


def test_fit_close_to_uncompressed(rank, size):
    """Stated tolerance: after 4 epochs of 8 steps (rank 2, compressed from
    step 4) the loss is within 0.02 of uncompressed fit's, from about 1."""
    reference = _model()
    ref_loss = _fit(reference, hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
                    rank, size, 8, epochs=4)
    model = _model()
    first = float(np.mean((model.predict(_data(size, 8)[0], verbose=0) - _data(size, 8)[1]) ** 2))
    opt = _powersgd_opt(rank=2, start_step=3)
    loss = _fit(model, opt, rank, size, 8, epochs=4)
    assert first > 0.5 and abs(loss - ref_loss) < 0.02, (first, loss, ref_loss)
    assert _same_on_every_rank(model.get_weights())
    names = [v.name for v in opt.variables]
    assert any("powersgd_error" in n for n in names), names


@pytest.mark.parametrize("with_state", [True, False], ids=["with_state", "without"])
def test_checkpoint_resumes_the_same_training(rank, size, tmp_path, with_state, opt_kind):
    model = _model()
    opt = _powersgd_opt(opt_kind, rank=1, start_step=1)
    _fit(model, opt, rank, size, 3)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / f"ckpt{rank}"))
    _fit(model, opt, rank, size, 3)
    straight = model.get_weights()
    compressor = opt._tfring_settings["compression"]
    assert int(compressor.step.numpy()) == 6
    tf.train.Checkpoint(model=model, optimizer=opt).restore(path)
    assert int(compressor.step.numpy()) == 3
    if not with_state:
        for v in compressor.errors + compressor.qs:
            if v is not None:
                v.assign(tf.zeros_like(v) + 0.5)
    _fit(model, opt, rank, size, 3)
    same = all(np.array_equal(a, b) for a, b in zip(straight, model.get_weights()))
    assert same == with_state


def test_state_through_an_elastic_reset(rank, size, opt_kind):
    model = _model()
    opt = _powersgd_opt(opt_kind, rank=1, start_step=0)
    _fit(model, opt, rank, size, 2)
    state = TensorFlowKerasState(model, opt)
    compressor = opt._tfring_settings["compression"]
    saved = [v.numpy().copy() for v in compressor.errors if v is not None]
    _fit(model, opt, rank, size, 2)
    state.restore()
    assert int(compressor.step.numpy()) == 2
    assert all(np.array_equal(a, v.numpy())
               for a, v in zip(saved, [v for v in compressor.errors if v is not None]))
    state.sync()
    assert _same_on_every_rank([q.numpy() for q in compressor.qs if q is not None])
    errors = [v.numpy() for v in compressor.errors if v is not None]
    assert all(np.any(e) for e in errors) == (rank == 0)


@pytest.mark.skipif(not xla_kernels_expected(tf.__version__),
                    reason="this TensorFlow gives tfring's collectives no XLA kernels")
def test_fit_compiled_with_xla_trains_as_without(rank, size):
    """PowerSGD inside the XLA-compiled train step (its switch at start_step
    a conditional around the collectives, its QR XLA's, its state built
    before the step is traced) trains to the weights it gives without XLA,
    within float32 rounding. (fp16 and bf16 in a compiled step:
    tests/tensorflow/ranks/test_training.py.)"""
    weights = []
    for jit_compile in (False, True):
        model = _model()
        opt = _powersgd_opt(rank=2, start_step=2)
        _fit(model, opt, rank, size, 6, jit_compile=jit_compile)
        assert model.jit_compile is jit_compile
        assert int(opt._tfring_settings["compression"].step.numpy()) == 6
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert _same_on_every_rank(weights[1])
