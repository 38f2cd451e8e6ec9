"""What a tfring DistributedOptimizer does on every update, as mixins that
:mod:`tfring.keras.optimizer` puts in front of an optimizer's own class: the
gradients are reduced across ranks (or aggregated locally first, with
backward_passes_per_step > 1) before the inner update runs.

:mod:`tfring.keras.xla` recognises a distributed optimizer by these mixins.
"""
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from tfring.common import basics
from tfring.tensorflow.gradient_aggregation import GradientReducer, LocalGradientAggregator


def _check_not_xla():
    """Refuses an XLA-compiled update where tfring may not use XLA
    (TFRING_XLA=0, or a build without XLA kernels); elsewhere the gradients
    are reduced inside the compiled step."""
    graph = tf.compat.v1.get_default_graph()
    if not control_flow_util.GraphOrParentsInXlaContext(graph):
        return
    why = basics._why_no_xla()
    if why is not None:
        raise RuntimeError(
            f"This step is being compiled with XLA, but {why}. Compile the model with "
            "jit_compile=False, and do not call tfring from a tf.function(jit_compile=True).")


class _DistributedState:
    """Per-optimizer reducer and (for backward_passes_per_step > 1) aggregator."""

    def __init__(self, settings):
        self.reducer = GradientReducer(
            settings["compression"], settings["sparse_as_dense"], settings["op"],
            settings["gradient_predivide_factor"], settings["groups"], settings["process_set"],
            scale_local_gradients=settings["scale_local_gradients"],
            name="DistributedOptimizer")
        passes = settings["backward_passes_per_step"]
        self.aggregator = None if passes == 1 else LocalGradientAggregator(
            passes, self.reducer, settings["average_aggregated_gradients"])


class _DistributedMixin:
    _tfring_settings = None  # set on each generated subclass

    def _tfring_state(self):
        state = self.__dict__.get("_tfring_state_")
        if state is None:
            state = _DistributedState(self._tfring_settings)
            object.__setattr__(self, "_tfring_state_", state)
        return state

    def register_local_var(self, var):
        """Keeps `var`'s gradient local to this rank: it is not reduced across
        ranks, only divided by the process set's size when the optimizer was
        made with scale_local_gradients=True (the default), as Horovod does.

        Args:
            var: one of the variables this optimizer updates.

        Example:
            >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
            >>> for v in model.layers[-1].trainable_weights:
            ...     opt.register_local_var(v)
        """
        self._tfring_state().reducer.add_local_variables([var])

    def _tfring_update(self, grads, variables, apply_fn):
        """Reduces `grads` and runs apply_fn(reduced), directly or every Nth pass."""
        _check_not_xla()
        state = self._tfring_state()
        if state.aggregator is None:
            return apply_fn(state.reducer(grads, variables))
        return state.aggregator.step(grads, variables, apply_fn,
                                     lambda: self.iterations.assign_add(1))

    def _tfring_stateful(self):
        return getattr(self._tfring_settings["compression"], "stateful", False)

    def _tfring_build_compression(self, variables, add_variable):
        """Makes a stateful compressor's state (PowerSGD's) optimizer
        variables, one per position of `variables` (the list the optimizer
        is built with and the gradients come in), so that checkpoints,
        model.save and TensorFlowKerasState save and restore them with the
        optimizer's own. Once: later calls do nothing."""
        if self._tfring_stateful():
            self._tfring_settings["compression"].build([v.shape for v in variables],
                                                       add_variable=add_variable)


class _Keras3Mixin(_DistributedMixin):
    def build(self, variables):
        super().build(variables)
        self._tfring_build_compression(variables, lambda name, shape, dtype, init: (
            self.add_variable(shape, initializer=init, dtype=dtype, name=name)))

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        elif not self.built:
            return super().apply(grads, trainable_variables)  # Keras raises its own error
        variables = trainable_variables or list(self._trainable_variables)
        if not self.built:
            # Build outside any tf.cond so optimizer variables are created once.
            self.build(variables)
            self.built = True
        parent = super()
        return self._tfring_update(grads, variables,
                                   lambda reduced: parent.apply(reduced, trainable_variables))


class _TFKerasMixin(_DistributedMixin):
    """tf_keras (Keras 2): its optimizers (tf_keras.optimizers.*) build in
    build(var_list), its legacy ones (tf_keras.optimizers.legacy.*) in
    _create_all_weights(var_list); the subclasses below hook the one their
    base has."""

    def _tfring_prebuild(self, variables):
        raise NotImplementedError

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        grads = [g for g, _ in grads_and_vars]
        variables = [v for _, v in grads_and_vars]
        if self._tfring_stateful():
            # tf_keras builds inside apply_gradients, after the reduction
            # has used the compressor's state: build first, with every
            # variable (the positions the gradients come in), outside any
            # tf.cond or compiled step.
            with tf.init_scope():
                self._tfring_prebuild(variables)
        parent = super()
        return self._tfring_update(
            grads, variables,
            lambda reduced: parent.apply_gradients(list(zip(reduced, variables)), *args,
                                                   **kwargs))


class _TFKerasOptimizerMixin(_TFKerasMixin):
    def build(self, var_list):
        super().build(var_list)
        self._tfring_build_compression(var_list, lambda name, shape, dtype, init: (
            self.add_variable(shape, dtype=dtype, initializer=init, name=name)))

    def _tfring_prebuild(self, variables):
        self.build(variables)


class _TFKerasLegacyMixin(_TFKerasMixin):
    def _create_all_weights(self, var_list):
        super()._create_all_weights(var_list)
        self._tfring_build_compression(var_list, self._tfring_add_weight)

    def _tfring_add_weight(self, name, shape, dtype, init):
        # add_weight makes the variable a checkpoint dependency (by name);
        # _weights is what optimizer.variables() and get_weights() list.
        variable = self.add_weight(name, shape, dtype=tf.as_dtype(dtype), initializer=init,
                                   trainable=False)
        self._weights.append(variable)
        return variable

    def _tfring_prebuild(self, variables):
        self._create_all_weights(variables)
