"""Keras callbacks for data-parallel training: a drop-in for
``horovod.tensorflow.keras.callbacks``.

The classes subclass ``tf.keras.callbacks.Callback`` (or ``ModelCheckpoint``)
of whichever Keras ``tf.keras`` resolves to: Keras 3, or tf_keras (Keras 2)
with ``TF_USE_LEGACY_KERAS=1``. They are built on first access, so importing
this module does not make ``tf.keras`` pick its flavour.

Momentum correction (Goyal et al., arXiv 1706.02677) works with Keras 3 and
tf_keras optimizers, whose ``momentum`` is a plain Python float that the
traced train step would otherwise bake in: while ``fit`` runs, the learning
rate callbacks replace it with a float that reads a ``tf.Variable`` when the
step is traced, and put the plain float back when training ends.

Example:
    >>> import tfring.keras as hvd
    >>> from tfring.keras import callbacks as hvd_callbacks
    >>> hvd.init()
    >>> model.fit(x, y, callbacks=[
    ...     hvd_callbacks.BroadcastGlobalVariablesCallback(0),
    ...     hvd_callbacks.MetricAverageCallback(),
    ...     hvd_callbacks.LearningRateWarmupCallback(initial_lr=0.1 * hvd.size()),
    ... ])
"""
import contextlib
import weakref

import numpy as np
import tensorflow as tf

from tfring.common import basics
from tfring.tensorflow import functions, mpi_ops

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "BestModelCheckpoint"]


# ---------------------------------------------------------------------------
# Helpers shared by the callbacks (independent of the Keras flavour).
# ---------------------------------------------------------------------------

def _optimizer_variables(optimizer):
    from tfring.keras.values import optimizer_variables
    return optimizer_variables(optimizer) if optimizer is not None else []


def _model_weights(model):
    # A model that is not built yet (a Sequential without an input shape, a
    # subclassed model before its first call) gets its weights in the first
    # step, and tf_keras raises on asking for them before: they are broadcast
    # at the end of the first batch instead.
    if not getattr(model, "built", True):
        return []
    # Keras 3's `model.variables` also holds SeedGenerator states: broadcasting
    # those would give every rank the same dropout masks. `weights` is the
    # trainable and non-trainable weights only (the same list in tf_keras).
    return list(getattr(model, "weights", None) or getattr(model, "variables", []))


def _identity_keys(variable):
    """ids that identify a variable: a Keras 3 variable also by the
    tf.Variable it wraps, so either form can be passed as local."""
    keys = {id(variable)}
    inner = getattr(variable, "_value", None)
    if isinstance(inner, tf.Variable):
        keys.add(id(inner))
    return keys


def _as_float(value):
    return float(np.asarray(value))


def _get_lr(optimizer):
    return _as_float(optimizer.learning_rate)


def _set_lr(optimizer, value):
    # Keras 3 and tf_keras assign to their learning-rate variable; tf_keras's
    # legacy optimizers go through _set_hyper. A LearningRateSchedule raises
    # Keras's own TypeError.
    optimizer.learning_rate = value


class _MomentumVariable(float):
    """Stands for an optimizer's float `momentum` while `fit` runs.

    As a Python number it is the configured momentum, so `if self.momentum != 0`
    and `get_config()` behave as before; converted to a tensor (which is what
    the optimizer's update step does) it reads `variable`, so assigning the
    variable changes the update of an already traced train step.
    """

    def __new__(cls, value, variable):
        obj = super().__new__(cls, value)
        obj.variable = variable
        return obj

    def __tf_tensor__(self, dtype=None, name=None):
        value = self.variable.read_value()
        if dtype is not None and tf.as_dtype(dtype) != value.dtype:
            value = tf.cast(value, dtype)
        return value

    def __reduce__(self):
        return (float, (float(self),))

    def __copy__(self):
        return float(self)

    def __deepcopy__(self, memo):
        return float(self)


# One momentum variable per optimizer for the optimizer's lifetime: a train
# function traced in an earlier fit() still reads it.
_momentum_variables = weakref.WeakKeyDictionary()


def _momentum_owner(optimizer):
    """The optimizer object holding `momentum` (looking through wrappers with
    `inner_optimizer`, such as a LossScaleOptimizer), or None."""
    seen = set()
    opt = optimizer
    while opt is not None and id(opt) not in seen:
        seen.add(id(opt))
        hyper = getattr(opt, "_hyper", None)
        if isinstance(hyper, dict) and "momentum" in hyper:
            return opt
        try:
            if hasattr(opt, "momentum"):
                return opt
        except Exception:  # pylint: disable=broad-except
            pass
        opt = getattr(opt, "inner_optimizer", None)
    return None


class _Momentum:
    """Reads and assigns an optimizer's momentum during one fit()."""

    def __init__(self, optimizer, model):
        self.owner = _momentum_owner(optimizer)
        self.variable = None
        self.installed = None
        if self.owner is None:
            return
        hyper = getattr(self.owner, "_hyper", None)
        if isinstance(hyper, dict) and "momentum" in hyper and hasattr(self.owner,
                                                                      "_create_hypers"):
            # tf_keras legacy optimizer: its hyperparameters become variables.
            self.owner._create_hypers()  # pylint: disable=protected-access
        momentum = self.owner.momentum
        if isinstance(momentum, _MomentumVariable):
            # Another callback of this fit() installed it (or an interrupted
            # fit left it): no step has run yet, so reset it to the float.
            self.variable = momentum.variable
            self.variable.assign(float(momentum))
        elif hasattr(momentum, "assign"):
            self.variable = momentum
        elif isinstance(momentum, (int, float)) and not isinstance(momentum, bool):
            if momentum == 0:
                return  # momentum 0 times any factor stays 0
            try:
                variable = _momentum_variables.get(self.owner)
            except TypeError:
                variable = None
            retrace = variable is None
            if variable is None:
                with tf.init_scope():
                    variable = tf.Variable(float(momentum), trainable=False, dtype=tf.float32,
                                           name="tfring_momentum")
                try:
                    _momentum_variables[self.owner] = variable
                except TypeError:
                    pass
            else:
                variable.assign(float(momentum))
            self.installed = _MomentumVariable(float(momentum), variable)
            self.owner.momentum = self.installed
            self.variable = variable
            if retrace and getattr(model, "train_function", None) is not None and hasattr(
                    model, "make_train_function"):
                # A train step traced before now baked the float in.
                model.make_train_function(force=True)

    def read(self):
        return None if self.variable is None else _as_float(self.variable)

    def assign(self, value):
        if self.variable is not None:
            self.variable.assign(value)

    def release(self):
        """Puts the plain float back (at the end of fit)."""
        if self.installed is not None and self.owner.momentum is self.installed:
            self.owner.momentum = float(self.installed)
            self.variable.assign(float(self.installed))
        self.installed = None


def _keras():
    return tf.keras


def _steps_per_epoch(params, callback_name):
    params = params or {}
    if params.get("steps"):
        return params["steps"]
    if params.get("samples") and params.get("batch_size"):
        return params["samples"] // params["batch_size"]
    raise ValueError(
        "Could not autodetect the number of steps per epoch. Please specify the "
        f"steps_per_epoch parameter to the {callback_name}() (fit() did not report "
        "'steps': the input has no known length).")


# ---------------------------------------------------------------------------
# The callback classes, defined against a given Keras module.
# ---------------------------------------------------------------------------

def _define(keras):
    Callback = keras.callbacks.Callback

    class BroadcastGlobalVariablesCallback(Callback):
        """Broadcasts the model's and its optimizer's variables from `root_rank`
        so that every rank trains from the same state.

        Every variable that exists when training begins is broadcast in
        `on_train_begin`, so that a built model's first step starts from the
        root's weights (Horovod broadcasts only after the first batch). When
        the first step creates variables (a model that is not built yet, such
        as a `Sequential` without an input shape, builds in it; tf_keras builds
        its optimizer's slots there), every variable, the optimizer's slots
        included, is broadcast at the end of the first batch, as in Horovod.
        An unbuilt model's first step therefore runs from each rank's own
        initial weights: with a DistributedOptimizer each rank applies the
        average of the gradients taken at the ranks' own weights, and from the
        end of the first batch on all ranks hold the root's values. Give the
        model an input shape, or seed every rank alike, for a first step that
        equals one process training from the root's weights. This happens in
        every `fit()`. Keras 3 random seed states are not broadcast (each rank
        keeps its own dropout masks).

        Args:
            root_rank: the rank whose values every rank gets.
            device: a device for the broadcasts ('' lets TensorFlow choose).
            local_variables: variables to leave alone (rank-local state).

        Raises:
            tf.errors.FailedPreconditionError: ranks' models differ in shapes or
                dtypes (raised by the broadcast, on every rank).

        Example:
            >>> callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
            >>> model.fit(x, y, callbacks=callbacks)
        """

        def __init__(self, root_rank, device="", local_variables=None):
            super().__init__()
            self.root_rank = root_rank
            self.device = device
            self.local_variables = list(local_variables or [])
            self.broadcast_done = False
            self._broadcast_ids = set()

        def _device(self):
            return tf.device(self.device) if self.device else contextlib.nullcontext()

        def _variables(self):
            local = set()
            for var in self.local_variables:
                local |= _identity_keys(var)
            seen = set()
            result = []
            optimizer = getattr(self.model, "optimizer", None)
            for var in _model_weights(self.model) + _optimizer_variables(optimizer):
                keys = _identity_keys(var)
                if keys & local or id(var) in seen:
                    continue
                seen.add(id(var))
                result.append(var)
            return result

        def _broadcast(self, variables):
            with self._device():
                functions.broadcast_variables(variables, root_rank=self.root_rank)
            self._broadcast_ids |= {id(v) for v in variables}

        def on_train_begin(self, logs=None):
            self.broadcast_done = False
            self._broadcast_ids = set()
            self._broadcast(self._variables())

        def on_batch_end(self, batch, logs=None):
            if self.broadcast_done:
                return
            self.broadcast_done = True
            variables = self._variables()
            # Ranks build the same variables, so they agree on this test.
            if any(id(v) not in self._broadcast_ids for v in variables):
                self._broadcast(variables)

    class MetricAverageCallback(Callback):
        """Averages every numeric metric in the epoch-end logs over all ranks.

        The values in `logs` are replaced in place, so callbacks after this one
        in the list (ModelCheckpoint, EarlyStopping, ReduceLROnPlateau, History,
        ...) see the averages. The metrics go into one grouped allreduce in
        sorted-name order, so every rank submits the same sequence; values that
        are not numbers (or arrays of numbers) are left alone.

        Raises:
            tf.errors.FailedPreconditionError: ranks report different metrics.

        Example:
            >>> callbacks = [hvd.callbacks.MetricAverageCallback(),
            ...              keras.callbacks.EarlyStopping(monitor="val_loss")]
        """

        def __init__(self, device=""):
            super().__init__()
            self.device = device

        @staticmethod
        def _is_numeric(value):
            if isinstance(value, bool):
                return False
            if isinstance(value, (int, float, np.number)):
                return True
            if tf.is_tensor(value) or isinstance(value, np.ndarray):
                dtype = tf.as_dtype(value.dtype)
                return dtype.is_floating or dtype.is_integer
            return False

        def _average_metrics_in_place(self, logs):
            if not logs:
                return
            names = sorted(k for k, v in logs.items() if self._is_numeric(v))
            if not names:
                return
            values = [tf.constant(np.asarray(logs[k], dtype=np.float64)) for k in names]
            device = tf.device(self.device) if self.device else contextlib.nullcontext()
            with device:
                reduced = mpi_ops.grouped_allreduce(values, op=mpi_ops.Average,
                                                    name="tfring_metric_average")
            for name, value in zip(names, reduced):
                logs[name] = self._like(logs[name], value.numpy())

        @staticmethod
        def _like(old, value):
            """The average in the form of the value it replaces (an integer
            metric's average becomes float64)."""
            if tf.is_tensor(old):
                dtype = old.dtype if old.dtype.is_floating else tf.float64
                return tf.constant(value, dtype=dtype)
            if isinstance(old, (np.ndarray, np.generic)):
                new = np.asarray(value, dtype=old.dtype if old.dtype.kind == "f" else np.float64)
                return new[()] if isinstance(old, np.generic) else new
            return float(value)

        def on_epoch_end(self, epoch, logs=None):
            self._average_metrics_in_place(logs)

    class LearningRateScheduleCallback(Callback):
        """Sets the learning rate to `initial_lr * multiplier(epoch)` for epochs
        in `[start_epoch, end_epoch)`.

        With `staircase=True` the rate changes at the first batch of each
        epoch; with `staircase=False` at every batch, using fractional epochs
        `epoch + batch / steps_per_epoch`. With `momentum_correction` (Goyal et
        al.), the momentum is scaled by `new_lr / old_lr` for the one batch in
        which the rate changes. This works with Keras 3 and tf_keras optimizers
        (whose momentum is a float): during fit the float is swapped for one
        backed by a variable, and restored at the end of training. The current
        rate is written to the epoch-end logs as 'lr'.

        Args:
            initial_lr: the base learning rate (usually scaled by size()).
            multiplier: a number, or a function of the (fractional) epoch that
                returns the factor. A number implies `staircase=True`.
            start_epoch: the first epoch to adjust.
            end_epoch: the epoch to stop before (None: never stop).
            staircase: per epoch (True) or per batch (False).
            momentum_correction: scale the momentum when the rate changes.
            steps_per_epoch: batches per epoch; by default what fit() reports.

        Raises:
            ValueError: `initial_lr` is None; or, with staircase=False, the
                steps per epoch are neither given nor known to fit().
            TypeError: the optimizer's learning rate is a LearningRateSchedule.

        Example:
            >>> # Divide the rate by 10 from epoch 30 on.
            >>> cb = hvd.callbacks.LearningRateScheduleCallback(
            ...     initial_lr=0.1 * hvd.size(), multiplier=0.1, start_epoch=30)
        """

        def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None,
                     staircase=True, momentum_correction=True, steps_per_epoch=None):
            super().__init__()
            if initial_lr is None:
                raise ValueError("Parameter `initial_lr` is required")
            self.initial_lr = initial_lr
            self.start_epoch = start_epoch
            self.end_epoch = end_epoch
            self.staircase = staircase
            self.momentum_correction = momentum_correction
            self.steps_per_epoch = steps_per_epoch
            self.current_epoch = None
            self.restore_momentum = None
            self._momentum = None
            if not callable(multiplier):
                self.staircase = True
                self.multiplier = lambda epoch: multiplier
            else:
                self.multiplier = multiplier

        def _autodetect_steps_per_epoch(self):
            return _steps_per_epoch(self.params, type(self).__name__)

        def _adjust_learning_rate(self, epoch):
            optimizer = self.model.optimizer
            old_lr = _get_lr(optimizer)
            new_lr = self.initial_lr * self.multiplier(epoch)
            _set_lr(optimizer, new_lr)
            if self._momentum is not None and self._momentum.variable is not None:
                momentum = self._momentum.read()
                if old_lr != 0 and momentum:
                    self.restore_momentum = momentum
                    self._momentum.assign(momentum * new_lr / old_lr)

        def _restore_momentum_if_needed(self):
            if self.restore_momentum is not None:
                self._momentum.assign(self.restore_momentum)
                self.restore_momentum = None

        def on_train_begin(self, logs=None):
            if not self.staircase and not self.steps_per_epoch:
                self.steps_per_epoch = self._autodetect_steps_per_epoch()
            self.restore_momentum = None
            if self.momentum_correction:
                self._momentum = _Momentum(self.model.optimizer, self.model)

        def on_train_end(self, logs=None):
            self._restore_momentum_if_needed()
            if self._momentum is not None:
                self._momentum.release()
                self._momentum = None

        def on_epoch_begin(self, epoch, logs=None):
            self.current_epoch = epoch

        def on_batch_begin(self, batch, logs=None):
            if (self.current_epoch < self.start_epoch
                    or self.end_epoch is not None and self.current_epoch >= self.end_epoch):
                return
            if self.staircase and batch == 0:
                self._adjust_learning_rate(self.current_epoch)
            elif not self.staircase:
                self._adjust_learning_rate(self.current_epoch + float(batch) /
                                           self.steps_per_epoch)

        def on_batch_end(self, batch, logs=None):
            self._restore_momentum_if_needed()

        def on_epoch_end(self, epoch, logs=None):
            if logs is not None:
                logs["lr"] = _get_lr(self.model.optimizer)

    class LearningRateWarmupCallback(LearningRateScheduleCallback):
        """Ramps the learning rate from `initial_lr / size()` up to `initial_lr`
        over the first `warmup_epochs` epochs, per batch (Goyal et al.,
        arXiv 1706.02677):

            lr(epoch) = initial_lr / size * (epoch * (size - 1) / warmup_epochs + 1)

        As in Horovod, the fractional epoch used at batch `b` of epoch `e` is
        `e + (b + 1) / steps_per_epoch`, so the last warm-up batch runs at
        exactly `initial_lr`, which stays in place afterwards. Momentum
        correction is as in LearningRateScheduleCallback.

        Args:
            initial_lr: the rate to reach (usually the single-rank rate * size()).
            warmup_epochs: how many epochs the ramp takes.
            momentum_correction: scale the momentum when the rate changes.
            steps_per_epoch: batches per epoch; by default what fit() reports.
            verbose: print a line when the warm-up ends.

        Raises:
            ValueError: the steps per epoch are neither given nor known to fit().

        Example:
            >>> cb = hvd.callbacks.LearningRateWarmupCallback(
            ...     initial_lr=0.1 * hvd.size(), warmup_epochs=5, verbose=1)
        """

        def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True,
                     steps_per_epoch=None, verbose=0):
            def multiplier(epoch):
                # Shift by one batch so that each epoch ends on a round value.
                epoch += 1.0 / self.steps_per_epoch
                size = basics.size()
                return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

            super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                             staircase=False, momentum_correction=momentum_correction,
                             steps_per_epoch=steps_per_epoch)
            self.warmup_epochs = warmup_epochs
            self.verbose = verbose

        def on_epoch_end(self, epoch, logs=None):
            super().on_epoch_end(epoch, logs)
            if epoch == self.end_epoch - 1 and self.verbose > 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{_get_lr(self.model.optimizer):g}.")

    class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
        """A ModelCheckpoint that keeps the best model (save_best_only=True) and
        writes only on rank 0; other ranks never touch the file.

        Put MetricAverageCallback before it so that "best" is judged on the
        metric averaged over ranks.

        Args:
            monitor: the metric to judge by.
            verbose: 1 prints when rank 0 saves.
            mode: 'auto', 'min' or 'max'.
            save_freq: 'epoch', or a number of batches.
            filepath: where to save (Keras 3: ending in '.keras' or '.h5').
                May be set later as `callback.filepath`, before fit().
            **kwargs: other ModelCheckpoint arguments (e.g. save_weights_only).

        Raises:
            ValueError: at the start of training, if no filepath was set.

        Example:
            >>> cb = hvd.callbacks.BestModelCheckpoint(monitor="val_loss",
            ...                                        filepath="best.keras")
        """

        def __init__(self, monitor="val_loss", verbose=0, mode="auto", save_freq="epoch",
                     filepath=None, **kwargs):
            kwargs.setdefault("save_weights_only", False)
            placeholder = ("checkpoint.weights.h5" if kwargs["save_weights_only"]
                           else "checkpoint.keras")
            super().__init__(filepath=placeholder if filepath is None else filepath,
                             monitor=monitor, verbose=verbose, save_best_only=True, mode=mode,
                             save_freq=save_freq, **kwargs)
            if filepath is None:
                self.filepath = None

        @staticmethod
        def _is_root():
            return basics.rank() == 0

        def on_train_begin(self, logs=None):
            if self.filepath is None:
                raise ValueError("BestModelCheckpoint has no filepath: pass filepath= or set "
                                 "callback.filepath before fit().")
            super().on_train_begin(logs)

        def on_train_batch_end(self, batch, logs=None):
            if self._is_root():
                super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch, logs=None):
            if self._is_root():
                super().on_epoch_end(epoch, logs)

    classes = dict(BroadcastGlobalVariablesCallback=BroadcastGlobalVariablesCallback,
                   MetricAverageCallback=MetricAverageCallback,
                   LearningRateScheduleCallback=LearningRateScheduleCallback,
                   LearningRateWarmupCallback=LearningRateWarmupCallback,
                   BestModelCheckpoint=BestModelCheckpoint)
    for cls in classes.values():
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return classes


_classes = {}


def _get_classes():
    keras = _keras()
    key = keras.__name__
    if key not in _classes:
        _classes[key] = _define(keras)
    return _classes[key]


def __getattr__(name):
    if name in __all__:
        try:
            return _get_classes()[name]
        except AttributeError as e:
            # `from ... import` would turn this into a bare ImportError.
            raise RuntimeError(f"could not define the tfring Keras callbacks: {e}") from e
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
