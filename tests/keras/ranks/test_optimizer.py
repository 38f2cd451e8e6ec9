"""tfring.keras.DistributedOptimizer on whichever Keras tf.keras is (Keras 3,
or tf_keras under TF_USE_LEGACY_KERAS=1): numerical equivalence with one
process on the global batch, optimizer variety, config and save/load."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.keras as hvd
import tfring.tensorflow as hvd_tf
from tfring.keras.optimizer import _DistributedMixin, make_distributed_in_place
from support import xla_kernels_expected
from training_reference import (BATCH, FEATURES, LR, STEPS, assert_local_part_like_reference,
                                assert_trained_like_reference, global_data, initial_weights,
                                local_data)

keras = tf.keras
# Where this TensorFlow gives tfring's collectives XLA kernels, a step with
# XLA on ("on") and the TFRING_XLA=0 fallback; elsewhere only the fallback.
XLA_SWITCH = (["on"] if xla_kernels_expected(tf.__version__) else []) + ["tfring_xla_0"]
# What the fallback's notices and errors give as the reason: the switch, or
# (2.16-2.19) the build's missing XLA kernels.
WHY_NO_XLA = "TFRING_XLA=0" if xla_kernels_expected(tf.__version__) else "no XLA kernels"
KERAS3 = not tf.keras.__name__.startswith("tf_keras")


def linear_model(rank):
    # Weights are set after building: a Constant(array) initializer does not
    # survive tf_keras's .h5 saving.
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.set_weights(list(initial_weights(rank)))
    return model


def fit_distributed(rank, size, optimizer, steps=STEPS, **compile_kwargs):
    model = linear_model(rank)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False, **compile_kwargs)
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size, steps)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return model


def test_fit_matches_single_process(rank, size):
    model = fit_distributed(rank, size, hvd.DistributedOptimizer(keras.optimizers.SGD(LR)))
    w, b = model.get_weights()
    assert_trained_like_reference(w, b, size)


def test_fit_with_steps_per_execution(rank, size):
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
    model = fit_distributed(rank, size, opt, steps=4, steps_per_execution=2)
    assert_trained_like_reference(*model.get_weights(), size, steps=4)


def test_backward_passes_per_step_equals_accumulating_micro_batches(rank, size):
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), backward_passes_per_step=2)
    model = fit_distributed(rank, size, opt, steps=4)
    assert_trained_like_reference(*model.get_weights(), size, steps=4, accumulate=2)
    assert int(opt.iterations.numpy()) == 4  # every backward pass counts, as in Horovod


def test_sum_and_predivide(rank, size):
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Sum)
    model = fit_distributed(rank, size, opt)
    # Summing the ranks' mean gradients is averaging with a learning rate size times larger.
    assert_trained_like_reference(*model.get_weights(), size, lr=LR * size)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR), gradient_predivide_factor=2.0)
    assert_trained_like_reference(*fit_distributed(rank, size, opt).get_weights(), size)


# Gradients travel rounded to 11 (fp16) or 8 (bf16) bits of mantissa.
COMPRESSION_TOLERANCE = {"fp16": 2e-3, "bf16": 2e-2}


@pytest.mark.parametrize("name", sorted(COMPRESSION_TOLERANCE))
def test_fit_with_16bit_compression(rank, size, name):
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR),
                                   compression=getattr(hvd.Compression, name))
    tol = COMPRESSION_TOLERANCE[name]
    assert_trained_like_reference(*fit_distributed(rank, size, opt).get_weights(), size,
                                  rtol=tol, atol=tol)


def optimizer_factories():
    factories = {
        "sgd_momentum": lambda: keras.optimizers.SGD(LR, momentum=0.9, nesterov=True),
        "adam": lambda: keras.optimizers.Adam(0.01),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
        "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
        "clipnorm": lambda: keras.optimizers.SGD(LR, clipnorm=0.5),
    }
    if KERAS3:
        factories["loss_scale"] = lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(LR))
    else:
        factories["loss_scale"] = lambda: keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(LR))
    return factories


@pytest.mark.parametrize("kind", sorted(optimizer_factories()))
def test_optimizers_match_single_process(rank, size, kind):
    make = optimizer_factories()[kind]
    model = fit_distributed(rank, size, hvd.DistributedOptimizer(make()))
    # Reference: the same (undistributed) optimizer on the global batch.
    ref = linear_model(0)
    ref.compile(optimizer=make(), loss="mse", jit_compile=False)
    x, y = global_data(size)
    ref.fit(x, y, batch_size=BATCH * size, epochs=1, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=kind)
    everyone = hvd_tf.allgather_object([w.tolist() for w in model.get_weights()])
    assert all(e == everyone[0] for e in everyone), kind


def model_with_local_part(rank):
    """x -> shared(x) + local(x): `shared` (kernel w, bias b) is reduced, the
    bias-free `local` layer (kernel u, zeros at first) is each rank's own."""
    # Every name is given: the graph-mode collectives are keyed by tensor
    # names, which contain Keras's automatic names, and earlier tests of the
    # suite build models on rank 0 only (which advances its name counters).
    inputs = keras.Input((FEATURES,), name="local_part_input")
    shared = keras.layers.Dense(1, name="shared")
    local = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", name="local")
    added = keras.layers.Add(name="local_part_add")([shared(inputs), local(inputs)])
    model = keras.Model(inputs, added, name="local_part_model")
    shared.set_weights(list(initial_weights(rank)))
    return model, shared, local


def fit_with_local_part(rank, size, make_optimizer):
    model, shared, local = model_with_local_part(rank)
    model.compile(optimizer=make_optimizer(local), loss="mse", jit_compile=False)
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return (*shared.get_weights(), local.get_weights()[0])


def test_register_local_var_keeps_its_gradient_local(rank, size):
    def make(local):
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
        opt.register_local_var(local.kernel)
        return opt
    assert_local_part_like_reference(*fit_with_local_part(rank, size, make), rank, size)


@pytest.mark.parametrize("scale_local", [True, False], ids=["scaled", "unscaled"])
def test_partial_distributed_optimizer(rank, size, scale_local):
    def make(local):
        return hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=local,
                                               scale_local_gradients=scale_local)
    assert_local_part_like_reference(*fit_with_local_part(rank, size, make), rank, size,
                                     scale_local=scale_local)


def test_partial_distributed_optimizer_arguments():
    # Without local layers it is a plain DistributedOptimizer.
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR))
    assert isinstance(opt, _DistributedMixin) and isinstance(opt, keras.optimizers.SGD)
    with pytest.raises(ValueError, match="local_layers must be Keras layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(LR), local_layers=["dense"])


def test_config_round_trip():
    base = keras.optimizers.Adam(0.003, beta_1=0.8)
    opt = hvd.DistributedOptimizer(base, name="dist_adam")
    assert isinstance(opt, keras.optimizers.Adam) and isinstance(opt, _DistributedMixin)
    config = opt.get_config()
    assert config["name"] == "dist_adam" and abs(config["beta_1"] - 0.8) < 1e-7
    clone = type(opt).from_config(config)
    assert isinstance(clone, _DistributedMixin) and clone.get_config() == config
    # A plain optimizer is made from the same config: saved models load anywhere.
    assert type(keras.optimizers.get({"class_name": "Adam", "config": config})) is not type(opt)


def test_save_and_load_model_rewraps_optimizer(rank, size, tmp_path):
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR, momentum=0.5))
    model = fit_distributed(rank, size, opt)
    path = str(tmp_path / ("model.keras" if KERAS3 else "model.h5"))
    model.save(path)
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, _DistributedMixin)
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    # Training continues in sync on every rank.
    xs, ys = local_data(rank, size)
    loaded.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    everyone = hvd_tf.allgather_object([w.tolist() for w in loaded.get_weights()])
    assert all(e == everyone[0] for e in everyone)


@pytest.fixture
def tfring_xla_0(monkeypatch):
    """TFRING_XLA=0: tfring keeps its collectives out of XLA, and tfring.keras
    falls back to running a DistributedOptimizer's step without XLA."""
    monkeypatch.setenv("TFRING_XLA", "0")


def xla_notices(caplog, model):
    return [r for r in caplog.records
            if r.name == "tfring" and "without XLA" in r.getMessage()
            and f"'{model.name}'" in r.getMessage()]


def test_default_compile_on_a_gpu_machine_trains_without_xla(rank, size, gpu_like_auto,
                                                             caplog, tfring_xla_0):
    """Keras 3 would compile this train step with XLA (see gpu_like_auto);
    tfring turns XLA off for it, says so once, and the model trains like the
    reference."""
    caplog.set_level("WARNING", logger="tfring")
    model = linear_model(rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
    assert model.jit_compile is False
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert_trained_like_reference(*model.get_weights(), size)
    model.evaluate(xs, ys, batch_size=BATCH, verbose=0)
    model.fit(xs[:BATCH], ys[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    notices = xla_notices(caplog, model)
    assert len(notices) == 1, [r.getMessage() for r in caplog.records]
    assert "jit_compile=False" in notices[0].getMessage()  # how to silence it
    assert WHY_NO_XLA in notices[0].getMessage()  # why
    # Asking for no XLA gets no notice.
    quiet = linear_model(rank)
    quiet.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse",
                  jit_compile=False)
    quiet.fit(xs[:BATCH], ys[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    assert not xla_notices(caplog, quiet)


@pytest.mark.parametrize("how", ["in_place", "load_model"])
def test_optimizer_made_distributed_after_compile_trains_without_xla(
        rank, size, gpu_like_auto, caplog, tmp_path, how, tfring_xla_0):
    caplog.set_level("WARNING", logger="tfring")
    model = linear_model(rank)
    if how == "in_place":
        model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
        assert model.jit_compile is True  # a plain optimizer keeps Keras's XLA
        make_distributed_in_place(model.optimizer)
    else:
        # Saved by a GPU machine: the saved compile config says jit_compile=True.
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)), loss="mse")
        path = str(tmp_path / "model.keras")
        model.save(path)
        caplog.clear()  # the loaded model has the same name
        model = hvd.load_model(path)
        assert isinstance(model.optimizer, _DistributedMixin)
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert model.jit_compile is False
    assert_trained_like_reference(*model.get_weights(), size)
    assert len(xla_notices(caplog, model)) == 1


@pytest.mark.parametrize("xla", XLA_SWITCH)
def test_mixed_precision_default_compile(rank, size, gpu_like_auto, xla, monkeypatch):
    """Under mixed_float16, compile() wraps the DistributedOptimizer in a
    LossScaleOptimizer; the gradients are still averaged inside the XLA
    step, and with TFRING_XLA=0 XLA is still turned off."""
    if xla != "on":
        monkeypatch.setenv("TFRING_XLA", "0")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = linear_model(rank)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(LR)),
                      loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert not isinstance(model.optimizer, _DistributedMixin)  # Keras's wrapper is outside
    assert model.jit_compile is (xla == "on")
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size, steps=1)
    model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
    # Different data on every rank: equal weights mean the gradients were averaged.
    everyone = hvd_tf.allgather_object([w.tolist() for w in model.get_weights()])
    assert all(e == everyone[0] for e in everyone)


def test_explicit_jit_compile_true_gets_a_clear_error(rank, size, legacy_keras, tfring_xla_0):
    model = linear_model(rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
    xs, ys = local_data(rank, size, steps=1)
    if legacy_keras:
        # tf_keras: the step's trace refuses to put a collective into XLA.
        model.compile(optimizer=opt, loss="mse", jit_compile=True)
        with pytest.raises(RuntimeError, match=f"{WHY_NO_XLA}.*jit_compile=False"):
            model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)
        return
    with pytest.raises(ValueError, match=f"jit_compile=True.*{WHY_NO_XLA}.*jit_compile=False"):
        model.compile(optimizer=opt, loss="mse", jit_compile=True)
    # Made distributed after compile(jit_compile=True): refused at the first fit().
    model = linear_model(rank)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse", jit_compile=True)
    make_distributed_in_place(model.optimizer)
    with pytest.raises(ValueError, match="jit_compile=True.*jit_compile=False"):
        model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0)


@pytest.mark.parametrize("xla", XLA_SWITCH)
def test_xla_compiled_custom_step(rank, size, xla, monkeypatch):
    """A tf.function(jit_compile=True) step that applies a DistributedOptimizer
    reduces inside XLA and trains like the reference; with TFRING_XLA=0 it
    gets a clear error instead."""
    if xla != "on":
        monkeypatch.setenv("TFRING_XLA", "0")
    model = linear_model(rank)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LR))
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    xs, ys = local_data(rank, size)

    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    batches = [(tf.constant(xs[i:i + BATCH]), tf.constant(ys[i:i + BATCH]))
               for i in range(0, len(xs), BATCH)]
    if xla != "on":
        with pytest.raises(RuntimeError, match=f"{WHY_NO_XLA}.*tf.function.jit_compile=True."):
            step(*batches[0])
        return
    for x, y in batches:
        step(x, y)
    assert_trained_like_reference(*model.get_weights(), size)


def test_tensorflow_distributed_optimizer_routes_keras_optimizers():
    opt = hvd_tf.DistributedOptimizer(keras.optimizers.SGD(LR))
    assert isinstance(opt, _DistributedMixin)
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(opt)
    with pytest.raises(ValueError, match="op=hvd.Average, hvd.Sum or hvd.Adasum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(LR), op=hvd.Max)


@pytest.mark.parametrize("via", ["fit", "apply_gradients"])
def test_ranks_outside_the_set_apply_local_gradients(rank, size, partial_set, via):
    """Horovod's behaviour: a rank outside `process_set` trains on its own
    gradients instead of failing; members average theirs over the set."""
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=partial_set)
    x = np.array([[rank + 1.0]], np.float32)
    if via == "fit":
        # The loss is the prediction itself, (rank + 1) * w: its gradient is rank + 1.
        model.compile(optimizer=opt, loss=lambda y_true, y_pred: y_pred, jit_compile=False)
        model.fit(x, np.zeros([1, 1], np.float32), batch_size=1, epochs=1, verbose=0)
    else:
        kernel = model.layers[0].kernel
        opt.apply_gradients([(tf.constant(x), kernel)])
    want = np.mean([r + 1.0 for r in partial_set.ranks]) if partial_set.included() else rank + 1.0
    np.testing.assert_allclose(model.get_weights()[0], [[1.0 - want]], rtol=1e-6)
