"""DistributedOptimizer for Keras 3 and tf_keras optimizers.

The wrapper is a subclass of the optimizer's own class, so everything else
about the optimizer (its config, its variables, checkpoints, model.save)
stays what it was. Gradients are reduced at the one place each Keras flavour
funnels every update through:

* Keras 3: ``Optimizer.apply(grads, variables)``; both ``apply_gradients``
  and Keras 3's trainer call it. (Horovod overrode Keras 2's
  ``get_gradients`` / ``_aggregate_gradients``, which Keras 3 does not have.)
* tf_keras (Keras 2): ``apply_gradients(grads_and_vars)``.

Reduction happens before clipping, loss-scale checks and the inner update,
so every rank applies identical gradients.
"""
import tensorflow as tf

from tfring.common.process_sets import global_process_set
from tfring.keras import xla
from tfring.keras.distributed import (_DistributedMixin, _Keras3Mixin, _TFKerasLegacyMixin,
                                      _TFKerasOptimizerMixin)
from tfring.tensorflow import mpi_ops
from tfring.tensorflow.compression import Compression
from tfring.tensorflow.gradient_aggregation import GradientReducer


def _is_keras3(cls):
    return cls.__module__.startswith("keras") and hasattr(cls, "stateless_apply")


# Hook Keras 3 when tfring.keras is imported, before scripts compile models,
# so compile() records what jit_compile was asked for (see xla.py).
if _is_keras3(tf.keras.optimizers.Optimizer):
    xla.install()


def _distributed_class(base, settings):
    if issubclass(base, _DistributedMixin):
        raise ValueError(f"{base.__name__} is already a tfring DistributedOptimizer.")
    if _is_keras3(base):
        xla.install()
        mixin = _Keras3Mixin
    elif hasattr(base, "_create_all_weights"):
        mixin = _TFKerasLegacyMixin  # tf_keras.optimizers.legacy.*
    else:
        mixin = _TFKerasOptimizerMixin
    # Same name and module as the base, so saved configs name the plain
    # optimizer and load anywhere (tfring.keras.load_model re-wraps it).
    return type(base.__name__, (mixin, base),
                {"__module__": base.__module__, "_tfring_settings": settings,
                 "__doc__": base.__doc__})


def _settings(compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
              op=mpi_ops.Average, backward_passes_per_step=1, average_aggregated_gradients=False,
              groups=None, process_set=global_process_set, scale_local_gradients=True):
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1.")
    if op == mpi_ops.Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients=True.")
    settings = dict(locals())
    # Fail now, not at the first step, on a bad op or predivide factor.
    GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                    process_set)
    return settings


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=mpi_ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set,
                         scale_local_gradients=True):
    """Wraps a Keras optimizer so that gradients are averaged across ranks
    before clipping and before the update.

    Works with any Keras 3 optimizer (SGD, Adam, AdamW, RMSprop,
    LossScaleOptimizer, ...) and with tf_keras optimizers. The result is a
    new optimizer built from `optimizer.get_config()`.

    Args:
        optimizer: the Keras optimizer to wrap (not yet used for training).
        name: optional new name for the optimizer.
        compression: Compression.none, fp16, bf16 or powersgd(...)
            (tfring.tensorflow.compression); PowerSGD's state becomes
            optimizer variables.
        sparse_as_dense: reduce IndexedSlices gradients as dense tensors.
        gradient_predivide_factor: with op=Average, divide before the sum.
        op: hvd.Average (default), hvd.Sum or hvd.Adasum (gradients are
            combined with Adasum; see tfring.tensorflow.allreduce).
        backward_passes_per_step: sum gradients locally over this many steps
            and update on every Nth.
        average_aggregated_gradients: divide that local sum by the number of steps.
        num_groups, groups: reduce gradients in this many groups, or in the
            given lists of variables.
        process_set: the ranks that reduce; ranks outside it apply their
            local gradients, as in Horovod.

    Returns:
        The distributed optimizer (an instance of a subclass of optimizer's class).

    XLA: the collectives have XLA kernels, so a train step compiled with
    XLA (Keras 3's jit_compile="auto" on a GPU machine, or jit_compile=True)
    reduces the gradients inside the compiled step. With TFRING_XLA=0 (or a
    build without XLA kernels), a model compiled with the default
    jit_compile="auto" runs without XLA instead, and tfring logs a one-line
    notice, once per model, which jit_compile=False silences.

    Raises:
        ValueError: a bad op, predivide factor or backward_passes_per_step;
            (Keras 3, TFRING_XLA=0) at model.compile() or the first fit(), a
            model that trains with this optimizer and was compiled with
            jit_compile=True.
        RuntimeError: (TFRING_XLA=0) at the first step, if the step is
            XLA-compiled otherwise (tf_keras with jit_compile=True, or
            tf.function(jit_compile=True)).

    Example:
        >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
        >>> model.compile(optimizer=opt, loss="mse")
    """
    settings = _settings(compression, sparse_as_dense, gradient_predivide_factor, op,
                         backward_passes_per_step, average_aggregated_gradients,
                         groups if groups is not None else (num_groups or None), process_set,
                         scale_local_gradients)
    cls = _distributed_class(type(optimizer), settings)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=mpi_ops.Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set,
                                scale_local_gradients=True, local_layers=None):
    """Like DistributedOptimizer, but the gradients of `local_layers`' trainable
    weights stay local to each rank (divided by the set's size when
    scale_local_gradients), e.g. for layers that differ by rank on purpose.

    Args:
        local_layers: a Keras layer or a list of them whose weights are local.
        Other arguments: as DistributedOptimizer.

    Returns:
        The distributed optimizer, with each local weight registered through
        register_local_var().

    Raises:
        ValueError: `local_layers` holds something that is not a Keras layer,
            or the arguments DistributedOptimizer refuses.

    Example:
        >>> opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
        ...                                       local_layers=[model.layers[-1]])
    """
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError(f"PartialDistributedOptimizer: local_layers must be Keras layers, "
                             f"not {type(layer).__name__}.")
    opt = DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt


def make_distributed_in_place(optimizer, **settings):
    """Turns an existing optimizer (with its state) into a distributed one."""
    optimizer.__class__ = _distributed_class(type(optimizer), _settings(**settings))
    return optimizer


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Loads a saved Keras model and wraps its optimizer in DistributedOptimizer,
    keeping the optimizer's restored state.

    Args:
        filepath: the saved model (.keras, .h5 or SavedModel directory).
        custom_optimizers: accepted for Horovod compatibility; custom optimizer
            classes can also be passed in custom_objects.
        custom_objects: passed to keras.models.load_model.
        compression: the compression of the wrapped optimizer.

    Returns:
        The model, its optimizer distributed.

    Example:
        >>> model = hvd.load_model("checkpoint.keras")
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    from tfring.keras import sync_batch_norm  # noqa: F401  (registers the layer)
    model = tf.keras.models.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None and not isinstance(model.optimizer,
                                                                        _DistributedMixin):
        make_distributed_in_place(model.optimizer, compression=compression)
        xla.settle_loaded(model)
    return model
