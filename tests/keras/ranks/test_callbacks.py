"""tfring.keras.callbacks inside real model.fit() runs, checked against numbers.

Learning-rate callbacks train a one-weight linear model whose every gradient
is 1 (input 1, loss = mean prediction), so the SGD trajectory, with and without
momentum correction, can be computed exactly here. The optimizers are plain
(not DistributedOptimizer), so ranks given the same data stay in step.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
from tfring.keras import callbacks as hvd_callbacks
from tfring.keras.values import optimizer_variables
from training_reference import (BATCH, FEATURES, LR, assert_trained_like_reference,
                                initial_weights, local_data, reference)

MOMENTUM = 0.9


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def mean_prediction_loss(y_true, y_pred):
    """d loss / d w = mean(x) = 1 for a bias-free Dense(1) fed ones."""
    return tf.reduce_mean(y_pred)


def make_sgd(keras, kind, lr, momentum=MOMENTUM):
    if kind == "legacy":
        return keras.optimizers.legacy.SGD(learning_rate=lr, momentum=momentum)
    return keras.optimizers.SGD(learning_rate=lr, momentum=momentum)


def linear_model(keras, optimizer, w0=0.0):
    model = keras.Sequential([
        keras.Input(shape=(1,)),
        keras.layers.Dense(1, use_bias=False,
                           kernel_initializer=keras.initializers.Constant(w0)),
    ])
    model.compile(optimizer=optimizer, loss=mean_prediction_loss, jit_compile=False)
    return model


def ones_data(steps, batch_size=2):
    n = steps * batch_size
    return np.ones((n, 1), np.float32), np.zeros((n, 1), np.float32)


def current_momentum(optimizer):
    """The momentum the next update step will use (reads the variable behind
    a float installed by the callbacks)."""
    return float(np.asarray(tf.convert_to_tensor(optimizer.momentum)))


def make_recorder(keras):
    class Recorder(keras.callbacks.Callback):
        """Records (epoch, batch, lr, momentum) as the step is about to run."""

        def __init__(self):
            super().__init__()
            self.seen = []
            self.epoch = None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            opt = self.model.optimizer
            self.seen.append((self.epoch, batch, float(np.asarray(opt.learning_rate)),
                              current_momentum(opt)))
    return Recorder()


def simulate(w, v, lrs, momenta, grad=1.0):
    """Keras SGD (not Nesterov) with a constant gradient: v = mu v - lr g; w += v."""
    for lr, mu in zip(lrs, momenta):
        v = mu * v - lr * grad
        w = w + v
    return w, v


def corrected_momenta(lrs, adjusted, previous_lr):
    """The momentum per step: scaled by new/old lr in steps where the callback
    set the rate, MOMENTUM elsewhere."""
    out = []
    for lr, adj in zip(lrs, adjusted):
        out.append(MOMENTUM * lr / previous_lr if adj else MOMENTUM)
        previous_lr = lr
    return out


def warmup_lr(initial, size, warmup_epochs, steps, epoch, batch):
    """Goyal et al.'s ramp at Horovod's fractional epoch epoch + (batch+1)/steps."""
    if epoch >= warmup_epochs:
        return initial
    e = epoch + (batch + 1) / steps
    return initial / size * (e * (size - 1) / warmup_epochs + 1)


def gathered(value):
    """Every rank's value of a nest of arrays, as a list in rank order."""
    return hvd.allgather_object(tf.nest.map_structure(np.asarray, value))


def assert_same_on_all_ranks(values, what):
    everyone = gathered(values)
    for r, theirs in enumerate(everyone):
        for a, b in zip(theirs, everyone[0]):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: rank {r} differs from rank 0")


@pytest.fixture(params=["sgd", "legacy"])
def opt_kind(request, legacy_keras):
    if request.param == "legacy" and not legacy_keras:
        # Keras 3 has no legacy optimizers; the flavour is the same on every rank.
        pytest.skip("tf_keras legacy optimizers only")
    return request.param


def run_lr_case(keras, kind, callbacks, epochs, steps, compile_lr, expected_lr, adjusted,
                correction=True):
    """Fits the linear model and checks the lr and momentum seen at every batch
    and the final weight against the exact SGD trajectory."""
    model = linear_model(keras, make_sgd(keras, kind, compile_lr))
    rec = make_recorder(keras)
    x, y = ones_data(steps)
    history = model.fit(x, y, batch_size=2, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=list(callbacks) + [rec])
    grid = [(e, b) for e in range(epochs) for b in range(steps)]
    assert [(e, b) for e, b, _, _ in rec.seen] == grid
    lrs = [expected_lr(e, b) for e, b in grid]
    adj = [adjusted(e, b) for e, b in grid]
    np.testing.assert_allclose([s[2] for s in rec.seen], lrs, rtol=1e-6)
    momenta = corrected_momenta(lrs, adj, compile_lr) if correction else [MOMENTUM] * len(lrs)
    np.testing.assert_allclose([s[3] for s in rec.seen], momenta, rtol=1e-5)

    w_final = float(model.get_weights()[0][0, 0])
    w_expected, _ = simulate(0.0, 0.0, lrs, momenta)
    w_uncorrected, _ = simulate(0.0, 0.0, lrs, [MOMENTUM] * len(lrs))
    np.testing.assert_allclose(w_final, w_expected, rtol=1e-5, atol=1e-6)
    if correction and any(m != MOMENTUM for m in momenta[1:]):
        # The correction visibly changed the update (it is not a no-op).
        assert abs(w_expected - w_uncorrected) > 1e-3
        assert abs(w_final - w_uncorrected) > 1e-3

    # Once fit returns, `momentum` is what the user configured again.
    momentum = model.optimizer.momentum
    if kind == "sgd":
        assert type(momentum) is float and momentum == MOMENTUM
    np.testing.assert_allclose(current_momentum(model.optimizer), MOMENTUM, rtol=1e-6)
    if "lr" in history.history:
        np.testing.assert_allclose(history.history["lr"],
                                   [expected_lr(e, steps - 1) for e in range(epochs)], rtol=1e-6)
    return model, rec


# --------------------------------------------------------------------------
# LearningRateWarmupCallback / LearningRateScheduleCallback
# --------------------------------------------------------------------------

def test_warmup_follows_goyal_formula(keras, size, opt_kind):
    initial, warm, steps, epochs = 0.3, 2, 4, 3
    cb = hvd_callbacks.LearningRateWarmupCallback(initial_lr=initial, warmup_epochs=warm)
    _, rec = run_lr_case(
        keras, opt_kind, [cb], epochs, steps, compile_lr=0.05,
        expected_lr=lambda e, b: warmup_lr(initial, size, warm, steps, e, b),
        adjusted=lambda e, b: e < warm)
    # The first batch starts near initial/size and the last warm-up batch runs
    # at exactly initial_lr, which then stays.
    lrs = [s[2] for s in rec.seen]
    np.testing.assert_allclose(lrs[0], initial / size * (1 + (size - 1) / (warm * steps)),
                               rtol=1e-6)
    assert np.float32(lrs[warm * steps - 1]) == np.float32(initial)
    assert all(np.float32(lr) == np.float32(initial) for lr in lrs[warm * steps:])
    assert all(a <= b for a, b in zip(lrs, lrs[1:]))


def test_warmup_with_explicit_steps_per_epoch(keras, size):
    # steps_per_epoch given: used as is (here 8 although fit runs 4 a epoch).
    initial, warm, steps = 0.2, 1, 4
    cb = hvd_callbacks.LearningRateWarmupCallback(initial, warmup_epochs=warm,
                                                  steps_per_epoch=8)
    run_lr_case(keras, "sgd", [cb], 2, steps, compile_lr=0.1,
                expected_lr=lambda e, b: (warmup_lr(initial, size, warm, 8, e, b) if e < warm
                                          else warmup_lr(initial, size, warm, 8, 0, steps - 1)),
                adjusted=lambda e, b: e < warm)


def test_schedule_staircase(keras, opt_kind):
    initial, steps, epochs, compile_lr = 0.2, 3, 4, 0.2

    def expected(e, b):
        return compile_lr if e < 1 else initial * 0.5 ** min(e, 2)

    cb = hvd_callbacks.LearningRateScheduleCallback(initial, multiplier=lambda e: 0.5 ** e,
                                                    start_epoch=1, end_epoch=3)
    run_lr_case(keras, opt_kind, [cb], epochs, steps, compile_lr, expected,
                adjusted=lambda e, b: 1 <= e < 3 and b == 0)


def test_schedule_per_batch(keras, opt_kind):
    initial, steps, epochs, compile_lr = 0.4, 4, 2, 0.1
    cb = hvd_callbacks.LearningRateScheduleCallback(
        initial, multiplier=lambda epoch: 1.0 / (1.0 + epoch), staircase=False)
    run_lr_case(keras, opt_kind, [cb], epochs, steps, compile_lr,
                expected_lr=lambda e, b: initial / (1.0 + e + b / steps),
                adjusted=lambda e, b: True)


def test_schedule_constant_multiplier_is_staircase(keras):
    initial, steps, compile_lr = 0.3, 3, 0.1
    cb = hvd_callbacks.LearningRateScheduleCallback(initial, multiplier=0.25, start_epoch=1,
                                                    staircase=False)
    assert cb.staircase
    run_lr_case(keras, "sgd", [cb], 3, steps, compile_lr,
                expected_lr=lambda e, b: compile_lr if e < 1 else initial * 0.25,
                adjusted=lambda e, b: e >= 1 and b == 0)


def test_warmup_then_schedule_share_momentum(keras, size):
    # Horovod's usual pairing: warm up for an epoch, then a staircase schedule.
    initial, steps = 0.3, 3
    callbacks = [
        hvd_callbacks.LearningRateWarmupCallback(initial, warmup_epochs=1),
        hvd_callbacks.LearningRateScheduleCallback(initial, multiplier=lambda e: 0.5,
                                                   start_epoch=1),
    ]
    run_lr_case(keras, "sgd", callbacks, 3, steps, compile_lr=0.1,
                expected_lr=lambda e, b: (warmup_lr(initial, size, 1, steps, e, b) if e < 1
                                          else initial * 0.5),
                adjusted=lambda e, b: e < 1 or b == 0)


def test_without_momentum_correction(keras, opt_kind):
    initial, steps = 0.2, 3
    cb = hvd_callbacks.LearningRateScheduleCallback(initial, multiplier=lambda e: 0.5 ** e,
                                                    momentum_correction=False)
    run_lr_case(keras, opt_kind, [cb], 3, steps, compile_lr=0.2,
                expected_lr=lambda e, b: initial * 0.5 ** e,
                adjusted=lambda e, b: b == 0, correction=False)


def test_correction_applies_to_a_train_step_traced_earlier(keras):
    # A first fit() traces the train step with the plain float momentum; the
    # callback's later fits must still change the update (and a third fit
    # reuses the same momentum variable).
    steps, lr0 = 3, 0.2
    model = linear_model(keras, make_sgd(keras, "sgd", lr0))
    x, y = ones_data(steps)
    model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0)
    lrs, momenta = [lr0] * steps, [MOMENTUM] * steps
    for fit_no in range(2):
        cb = hvd_callbacks.LearningRateScheduleCallback(lr0, multiplier=lambda e: 0.5 ** (e + 1))
        model.fit(x, y, batch_size=2, epochs=2, shuffle=False, verbose=0, callbacks=[cb])
        for e in range(2):
            new = lr0 * 0.5 ** (e + 1)
            momenta += [MOMENTUM * new / lrs[-1]] + [MOMENTUM] * (steps - 1)
            lrs += [new] * steps
    w_expected, _ = simulate(0.0, 0.0, lrs, momenta)
    w_uncorrected, _ = simulate(0.0, 0.0, lrs, [MOMENTUM] * len(lrs))
    w_final = float(model.get_weights()[0][0, 0])
    np.testing.assert_allclose(w_final, w_expected, rtol=1e-5)
    assert abs(w_final - w_uncorrected) > 1e-3


def test_momentum_free_optimizer_is_left_alone(keras):
    # Adam has no momentum; SGD with momentum 0 needs no correction.
    for optimizer in (keras.optimizers.Adam(0.1), keras.optimizers.SGD(0.1)):
        model = linear_model(keras, optimizer)
        cb = hvd_callbacks.LearningRateScheduleCallback(0.2, multiplier=lambda e: 0.5 ** e)
        x, y = ones_data(2)
        model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[cb])
        np.testing.assert_allclose(float(np.asarray(model.optimizer.learning_rate)), 0.2 * 0.5,
                                   rtol=1e-6)
        assert not hasattr(model.optimizer, "momentum") or type(model.optimizer.momentum) is float


def test_schedule_arguments(keras):
    with pytest.raises(ValueError, match="initial_lr"):
        hvd_callbacks.LearningRateScheduleCallback(None, multiplier=1.0)
    # Per-batch schedules need the steps per epoch: fit() cannot know them
    # for a dataset of unknown length.
    model = linear_model(keras, make_sgd(keras, "sgd", 0.1))
    x, y = ones_data(2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2).filter(lambda a, b: True)
    cb = hvd_callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)
    with pytest.raises(ValueError, match="steps per epoch"):
        model.fit(ds, epochs=1, verbose=0, callbacks=[cb])
    assert type(model.optimizer.momentum) is float


# --------------------------------------------------------------------------
# MetricAverageCallback
# --------------------------------------------------------------------------

def make_log_copier(keras):
    class LogCopier(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.logs = []

        def on_epoch_end(self, epoch, logs=None):
            self.logs.append({k: float(np.asarray(v)) for k, v in (logs or {}).items()})
    return LogCopier()


def test_metric_average_replaces_logs_with_rank_mean(keras, rank, size):
    model = keras.Sequential([
        keras.Input(shape=(2,)),
        keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(0.5)),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", metrics=["mae"],
                  jit_compile=False)
    x = np.ones((8, 2), np.float32)
    y = np.full((8, 1), rank + 2.0, np.float32)       # loss rank^2 + 2 rank + 1
    yv = np.full((4, 1), 3.0 * rank, np.float32)
    before, after = make_log_copier(keras), make_log_copier(keras)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0,
                        validation_data=(x[:4], yv),
                        callbacks=[before, hvd_callbacks.MetricAverageCallback(), after])
    everyone = hvd.allgather_object(before.logs)
    for epoch in range(2):
        keys = sorted(before.logs[epoch])
        assert {"loss", "val_loss"} <= set(keys)
        assert sorted(after.logs[epoch]) == keys
        for key in keys:
            expected = np.mean([logs[epoch][key] for logs in everyone])
            np.testing.assert_allclose(after.logs[epoch][key], expected, rtol=1e-6,
                                       err_msg=key)
            np.testing.assert_allclose(history.history[key][epoch], expected, rtol=1e-6,
                                       err_msg=f"History {key}")
    if size > 1:
        assert len({logs[0]["loss"] for logs in everyone}) == size  # really rank-dependent
    assert hvd.allgather_object(after.logs) == [after.logs] * size


def test_metric_average_keeps_value_types(rank, size):
    cb = hvd_callbacks.MetricAverageCallback()
    logs = {"f32": np.float32(rank), "int": rank, "py": float(2 * rank), "text": "ok",
            "vec": np.array([rank, 2 * rank], np.float32), "t": tf.constant(3.0 * rank),
            "flag": True}
    cb.on_epoch_end(0, logs)
    mean = (size - 1) / 2.0
    assert isinstance(logs["f32"], np.float32) and logs["f32"] == np.float32(mean)
    assert logs["int"] == pytest.approx(mean) and logs["py"] == pytest.approx(2 * mean)
    assert logs["text"] == "ok" and logs["flag"] is True
    assert logs["vec"].dtype == np.float32
    np.testing.assert_allclose(logs["vec"], [mean, 2 * mean])
    assert tf.is_tensor(logs["t"]) and float(logs["t"]) == pytest.approx(3 * mean)
    cb.on_epoch_end(1, {})  # nothing to average, no collective
    cb.on_epoch_end(1, None)


# --------------------------------------------------------------------------
# BroadcastGlobalVariablesCallback
# --------------------------------------------------------------------------

def dense_model(keras, seed):
    def init(offset):
        return keras.initializers.RandomNormal(seed=seed * 10 + offset)
    model = keras.Sequential([
        keras.Input(shape=(3,)),
        keras.layers.Dense(4, kernel_initializer=init(1), bias_initializer=init(2)),
        keras.layers.Dense(1, kernel_initializer=init(3)),
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=MOMENTUM), loss="mse",
                  jit_compile=False)
    return model


def regression_data(seed, n=16):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32)).astype(np.float32)


def values_of(variables):
    return [np.asarray(v) for v in variables]


def make_first_batch_recorder(keras):
    class FirstBatchWeights(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.weights = None

        def on_train_batch_begin(self, batch, logs=None):
            if self.weights is None:
                self.weights = values_of(self.model.weights)
    return FirstBatchWeights()


def test_broadcast_syncs_model_and_optimizer(keras, rank, size):
    root = size - 1
    model = dense_model(keras, seed=rank)
    # Different data per rank: the weights and the momentum slots diverge.
    model.fit(*regression_data(rank), batch_size=4, epochs=1, shuffle=False, verbose=0)
    before = gathered(values_of(model.weights))
    if size > 1:
        assert not np.array_equal(before[0][0], before[1][0])
    first = make_first_batch_recorder(keras)
    cb = hvd_callbacks.BroadcastGlobalVariablesCallback(root)
    model.fit(*regression_data(1234), batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[cb, first])
    # The broadcast came before the first step: every rank started from root's weights.
    for got, want in zip(first.weights, before[root]):
        np.testing.assert_array_equal(got, want)
    assert_same_on_all_ranks(values_of(model.weights), "weights after fit")
    assert_same_on_all_ranks(values_of(optimizer_variables(model.optimizer)),
                             "optimizer variables after fit")


def constant_initializer(value):
    """An initializer for exactly `value` (as a function: tf_keras and Keras 3
    both call it with shape and dtype)."""
    return lambda shape, dtype=None: tf.constant(value, dtype=dtype)


def reference_linear_model(keras, rank, built):
    """training_reference's linear model with this rank's initial weights;
    without an input shape unless `built`, so that it builds in its first step."""
    w, b = initial_weights(rank)
    dense = keras.layers.Dense(1, kernel_initializer=constant_initializer(w),
                               bias_initializer=constant_initializer(b))
    return keras.Sequential([keras.Input((FEATURES,)), dense] if built else [dense])


def make_batch_end_recorder(keras):
    """Records the model's weights and the optimizer's variables at the end of
    the first batch, as the callbacks before it in the list left them."""
    class FirstBatchEnd(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.weights = self.optimizer_variables = None

        def on_train_batch_end(self, batch, logs=None):
            if self.weights is None:
                self.weights = values_of(self.model.weights)
                self.optimizer_variables = values_of(optimizer_variables(self.model.optimizer))
    return FirstBatchEnd()


@pytest.mark.parametrize("built", [True, False], ids=["built", "unbuilt"])
def test_broadcast_training_matches_reference(keras, rank, size, built):
    """The callback with a DistributedOptimizer, ranks starting from different
    weights. A built model is broadcast before the first step, so the whole run
    is one process's from rank 0's weights. An unbuilt model gets its weights
    in the first step: that step averages the gradients taken at every rank's
    own weights (Horovod's behaviour), rank 0's result is broadcast at the end
    of the batch, and the rest of the run is one process's from there."""
    import tfring.keras as hvd_keras

    model = reference_linear_model(keras, rank, built)
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(LR)),
                  loss="mse", jit_compile=False)
    assert model.built == built
    end_of_first = make_batch_end_recorder(keras)
    model.fit(*local_data(rank, size), batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd_callbacks.BroadcastGlobalVariablesCallback(0), end_of_first])
    # Collective checks first: a rank failing alone would leave the others
    # waiting in the next collective.
    assert_same_on_all_ranks(end_of_first.weights, "weights after the first batch")
    assert_same_on_all_ranks(values_of(model.weights), "weights after fit")
    own = not built
    first_w, first_b = reference(size, steps=1, first_step_from_own_weights=own)
    np.testing.assert_allclose(end_of_first.weights[0], first_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(end_of_first.weights[1], first_b, rtol=1e-5, atol=1e-6)
    assert_trained_like_reference(*model.get_weights(), size, first_step_from_own_weights=own)
    if own and size > 1:
        # The ranks' initial weights differ enough for the two cases to differ.
        assert not np.allclose(first_w, reference(size, steps=1)[0], rtol=1e-3)


def test_broadcast_of_an_unbuilt_model_and_its_optimizer_slots(keras, rank, size, opt_kind):
    """A Sequential without an input shape, a plain momentum optimizer and
    different data per rank: at the end of the first batch (the callbacks after
    the broadcast see it) every rank holds the root's weights and the root's
    optimizer variables, momentum slots included, which differed before."""
    root = size - 1
    model = keras.Sequential([
        keras.layers.Dense(4, kernel_initializer=keras.initializers.RandomNormal(seed=rank)),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer=make_sgd(keras, opt_kind, 0.05), loss="mse", jit_compile=False)
    assert not model.built
    before, after = make_batch_end_recorder(keras), make_batch_end_recorder(keras)
    model.fit(*regression_data(rank), batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[before, hvd_callbacks.BroadcastGlobalVariablesCallback(root), after])
    assert len(after.weights) == 4
    # One momentum slot per trainable weight, besides the iteration count (and,
    # in some flavours, the learning rate).
    assert len(after.optimizer_variables) > len(after.weights)
    everyone_before = gathered(before.weights + before.optimizer_variables)
    if size > 1:
        assert not np.array_equal(everyone_before[0][0], everyone_before[1][0])
        assert not np.array_equal(everyone_before[0][-1], everyone_before[1][-1])
    for got, want in zip(after.weights + after.optimizer_variables, everyone_before[root]):
        np.testing.assert_array_equal(got, want)


def test_broadcast_leaves_local_variables(keras, rank, size):
    model = dense_model(keras, seed=rank)
    local = model.layers[0].bias
    cb = hvd_callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local])
    cb.set_model(model)
    cb.on_train_begin()
    assert_same_on_all_ranks([np.asarray(model.layers[0].kernel),
                              np.asarray(model.layers[1].kernel)], "kernels")
    biases = gathered(np.asarray(local))
    if size > 1:
        assert not np.array_equal(biases[0], biases[1])


def test_broadcast_of_variables_created_in_first_step(keras, rank, size):
    # tf_keras builds optimizer slots in the first step: those are broadcast at
    # the end of the first batch (and only then). Driven by hand here so the
    # optimizer builds in between, whatever the flavour.
    model = dense_model(keras, seed=rank)
    opt = model.optimizer
    cb = hvd_callbacks.BroadcastGlobalVariablesCallback(0)
    cb.set_model(model)
    cb.on_train_begin()
    known = {id(v) for v in optimizer_variables(opt)}
    opt.build(model.trainable_variables)
    new = [v for v in optimizer_variables(opt) if id(v) not in known]
    assert new, "building the optimizer made no variables"
    for v in new:
        v.assign(np.full(v.shape, rank + 1.0, np.asarray(v).dtype))
    cb.on_train_batch_end(0)
    for v in new:
        np.testing.assert_array_equal(np.asarray(v), np.ones(v.shape))
    for v in new:
        v.assign(np.full(v.shape, rank + 1.0, np.asarray(v).dtype))
    cb.on_train_batch_end(1)  # once per fit: no second broadcast
    for v in new:
        np.testing.assert_array_equal(np.asarray(v), np.full(v.shape, rank + 1.0))


# --------------------------------------------------------------------------
# BestModelCheckpoint
# --------------------------------------------------------------------------

def test_best_model_checkpoint_writes_only_on_rank_0(keras, rank, size, shared_dir):
    model = dense_model(keras, seed=0)
    x, y = regression_data(7)
    # A different file name per rank shows who wrote; Horovod scripts pass the
    # same path on every rank.
    per_rank = hvd_callbacks.BestModelCheckpoint(
        monitor="loss", filepath=os.path.join(shared_dir, f"best_rank{rank}.keras"))
    same = hvd_callbacks.BestModelCheckpoint(monitor="val_loss", mode="min",
                                             filepath=os.path.join(shared_dir, "best.keras"))
    assert per_rank.save_best_only and same.save_best_only
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, validation_data=(x[:4], y[:4]),
              callbacks=[hvd_callbacks.MetricAverageCallback(), per_rank, same])
    hvd.barrier()
    seen = hvd.allgather_object(sorted(os.listdir(shared_dir)))
    assert seen == [["best.keras", "best_rank0.keras"]] * size
    if rank == 0:
        loaded = keras.models.load_model(os.path.join(shared_dir, "best_rank0.keras"),
                                         compile=False)
        assert [w.shape for w in loaded.get_weights()] == [w.shape for w in model.get_weights()]


def test_best_model_checkpoint_needs_a_filepath(keras):
    model = dense_model(keras, seed=0)
    cb = hvd_callbacks.BestModelCheckpoint(monitor="loss")
    with pytest.raises(ValueError, match="filepath"):
        model.fit(*regression_data(0), epochs=1, verbose=0, callbacks=[cb])


# --------------------------------------------------------------------------
# All together, with DistributedOptimizer
# --------------------------------------------------------------------------

def test_callbacks_with_distributed_optimizer(keras, rank, size):
    """Horovod's recipe: broadcast, metric averaging and warm-up around a
    DistributedOptimizer, ranks starting from different weights and seeing
    different data. Rank r's gradient is r + 1 (its inputs), so the averaged
    gradient is (size + 1) / 2 and the trajectory is known exactly."""
    import tfring.keras as hvd_keras

    initial, steps, epochs = 0.2, 3, 2
    opt = hvd_keras.DistributedOptimizer(make_sgd(keras, "sgd", 0.05))
    model = linear_model(keras, opt, w0=float(rank) + 3.0)
    rec = make_recorder(keras)
    after = make_log_copier(keras)
    x = np.full((steps * 2, 1), rank + 1.0, np.float32)
    history = model.fit(x, np.zeros_like(x), batch_size=2, epochs=epochs, shuffle=False,
                        verbose=0, callbacks=[
                            hvd_callbacks.BroadcastGlobalVariablesCallback(0),
                            hvd_callbacks.MetricAverageCallback(),
                            hvd_callbacks.LearningRateWarmupCallback(initial, warmup_epochs=1),
                            rec, after])
    grid = [(e, b) for e in range(epochs) for b in range(steps)]
    lrs = [warmup_lr(initial, size, 1, steps, e, b) for e, b in grid]
    momenta = corrected_momenta(lrs, [e < 1 for e, _ in grid], 0.05)
    np.testing.assert_allclose([s[2] for s in rec.seen], lrs, rtol=1e-6)
    np.testing.assert_allclose([s[3] for s in rec.seen], momenta, rtol=1e-5)
    w_expected, _ = simulate(3.0, 0.0, lrs, momenta, grad=(size + 1) / 2.0)
    w = float(model.get_weights()[0][0, 0])
    np.testing.assert_allclose(w, w_expected, rtol=1e-5)
    assert_same_on_all_ranks([model.get_weights()[0]], "weights")
    assert hvd.allgather_object(after.logs) == [after.logs] * size
    assert type(model.optimizer.momentum) is float
    assert len(history.history["loss"]) == epochs
