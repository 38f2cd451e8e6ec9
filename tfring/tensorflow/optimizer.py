"""DistributedOptimizer for TF1 optimizers (tf.compat.v1.train.*), used in
graph mode with minimize / compute_gradients / apply_gradients. A Keras
optimizer passed here is handed to tfring.keras.DistributedOptimizer."""
import tensorflow as tf

from tfring.common.process_sets import global_process_set
from tfring.tensorflow import mpi_ops
from tfring.tensorflow.compression import Compression
from tfring.tensorflow.gradient_aggregation import GradientReducer, LocalGradientAggregator


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    """Averages gradients across ranks in compute_gradients; with
    backward_passes_per_step > 1, apply_gradients sums locally and updates on
    every Nth call."""

    def __init__(self, optimizer, name, use_locking, reducer, backward_passes_per_step,
                 average_aggregated_gradients):
        super().__init__(name=name or f"Distributed{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = reducer
        self._aggregator = None
        if backward_passes_per_step > 1:
            self._aggregator = LocalGradientAggregator(backward_passes_per_step, reducer,
                                                       average_aggregated_gradients)

    def register_local_var(self, var):
        """Keeps `var`'s gradient local to this rank (not reduced; divided by
        the set's size with scale_local_gradients=True, as Horovod does)."""
        self._reducer.add_local_variables([var])

    def compute_gradients(self, *args, **kwargs):
        """Computes local gradients and (unless aggregating locally) averages them."""
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if self._aggregator is not None:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars) if grads_and_vars else ((), ())
        return list(zip(self._reducer(grads, variables), variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies the gradients (every Nth call with backward_passes_per_step)."""
        grads_and_vars = list(grads_and_vars)
        if self._aggregator is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]

        def apply(reduced):
            return self._optimizer.apply_gradients(list(zip(reduced, variables)), global_step,
                                                   name)

        def skip():
            if global_step is not None:
                return tf.compat.v1.assign_add(global_step, 1)
            return None
        return self._aggregator.step(grads, variables, apply, skip)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class _DistributedAdasumOptimizerV1(tf.compat.v1.train.Optimizer):
    """Horovod's TF1 Adasum optimizer: each rank applies the wrapped optimizer
    to its own gradients, and every backward_passes_per_step-th step the
    ranks combine what that moved the variables by (the delta since the last
    combination) with Adasum, so the wrapped optimizer's own update rule
    (momentum, Adam's scaling) shapes what is combined."""

    def __init__(self, optimizer, name, use_locking, compression, backward_passes_per_step):
        super().__init__(name=name or f"DistributedDelta{type(optimizer).__name__}",
                         use_locking=use_locking)
        self._optimizer = optimizer
        self._compression = compression
        self._passes = backward_passes_per_step

    def compute_gradients(self, *args, **kwargs):
        """The local gradients: Adasum combines the updates, not the gradients."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies the local update, then on a communication step sets every
        variable to its last combined value plus the Adasum of the deltas."""
        grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
        variables = [v for _, v in grads_and_vars]
        with tf.compat.v1.variable_scope(self.get_name(), reuse=tf.compat.v1.AUTO_REUSE):
            step = tf.compat.v1.get_variable("adasum_step", [], tf.int64, trainable=False,
                                             initializer=tf.compat.v1.zeros_initializer(),
                                             use_resource=True)
        starts = [self._zeros_slot(v, "delta_start", self.get_name()) for v in variables]
        # The variables' values when training starts (after any broadcast).
        first = tf.equal(step, 0)
        init = [tf.cond(first, lambda s=s, v=v: tf.group(s.assign(v)), tf.no_op)
                for s, v in zip(starts, variables)]
        with tf.control_dependencies(init):
            local = self._optimizer.apply_gradients(grads_and_vars, global_step, name)

        def combine():
            deltas = [tf.convert_to_tensor(v) - s for v, s in zip(variables, starts)]
            combined = mpi_ops.grouped_allreduce(deltas, op=mpi_ops.Adasum,
                                                 compression=self._compression)
            return tf.group([v.assign(s.assign_add(d)) for v, s, d in
                             zip(variables, starts, combined)])
        with tf.control_dependencies([local]):
            communicate = tf.equal(step % self._passes, self._passes - 1)
            synced = tf.cond(communicate, combine, tf.no_op)
        with tf.control_dependencies([synced]):
            return step.assign_add(1).op

    def get_slot(self, var, name):
        mine = super().get_slot(var, name)
        return mine if mine is not None else self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        return super().get_slot_names() + self._optimizer.get_slot_names()

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def _is_keras_optimizer(optimizer):
    module = type(optimizer).__module__
    return module.startswith("keras") or module.startswith("tf_keras") or hasattr(optimizer,
                                                                                   "apply")


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=mpi_ops.Average,
                         gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps an optimizer so that gradients are averaged across ranks before
    they are applied.

    Args:
        optimizer: a tf.compat.v1.train.Optimizer, or a Keras optimizer (then
            tfring.keras.DistributedOptimizer is used).
        name: name of the wrapper (default "Distributed" + the class name).
        use_locking: passed to tf.compat.v1.train.Optimizer.
        compression, sparse_as_dense, op, gradient_predivide_factor, groups,
        process_set: see DistributedGradientTape.
        backward_passes_per_step: sum gradients locally over this many
            passes and update on every Nth (apply_gradients is a no-op
            otherwise, apart from incrementing global_step).
        average_aggregated_gradients: divide the local sum by
            backward_passes_per_step.
        op=hvd.Adasum follows Horovod: gradients stay local, each rank
            applies the wrapped optimizer, and every backward_passes_per_step
            steps the ranks combine their variable deltas with Adasum (see
            allreduce). Use the learning rate of a single rank.

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: bad op, predivide factor or backward_passes_per_step.
        NotImplementedError: Adasum on a number of ranks that is not a power
            of two, or on a process set other than the global one.

    Example:
        >>> opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        >>> train_op = opt.minimize(loss, global_step=global_step)
    """
    if _is_keras_optimizer(optimizer):
        from tfring.keras.optimizer import DistributedOptimizer as KerasDistributedOptimizer
        return KerasDistributedOptimizer(
            optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor, op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients, groups=groups,
            process_set=process_set, scale_local_gradients=scale_local_gradients)
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError(f"DistributedOptimizer got {type(optimizer).__name__}; pass a "
                         "tf.compat.v1.train.Optimizer or a Keras optimizer.")
    if op == mpi_ops.Adasum:
        if average_aggregated_gradients:
            raise ValueError("Adasum does not support average_aggregated_gradients=True.")
        mpi_ops._check_adasum([], process_set)
        return _DistributedAdasumOptimizerV1(optimizer, name, use_locking,
                                             compression or Compression.none,
                                             backward_passes_per_step)
    reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor,
                              groups, process_set, scale_local_gradients=scale_local_gradients,
                              name=name or "DistributedOptimizer")
    return _DistributedOptimizerV1(optimizer, name, use_locking, reducer,
                                   backward_passes_per_step, average_aggregated_gradients)
