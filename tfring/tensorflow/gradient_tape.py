"""DistributedGradientTape: a GradientTape whose gradients are averaged
across ranks, in eager mode and inside tf.function."""
import tensorflow as tf

from tfring.common.process_sets import global_process_set
from tfring.tensorflow import mpi_ops
from tfring.tensorflow.compression import Compression
from tfring.tensorflow.gradient_aggregation import GradientReducer


class _DistributedTapeMixin:
    """Overrides gradient(); mixed into the class of the tape being wrapped."""

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        grads = super().gradient(target, sources, output_gradients=output_gradients,
                                 unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._tfring_reducer(flat_grads, flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def register_local_source(self, source):
        """Keeps the gradient of `source` local to this rank: gradient() does
        not reduce it across ranks (it is divided by the process set's size
        when the tape was made with scale_local_gradients=True, the default,
        as Horovod does).

        Args:
            source: a variable (or a watched tensor) passed to gradient() later.

        Example:
            >>> tape = hvd.DistributedGradientTape(tape)
            >>> tape.register_local_source(model.layers[-1].kernel)
            >>> grads = tape.gradient(loss, model.trainable_variables)
        """
        self._tfring_reducer.add_local_variables([source])

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Computes gradient() and splits it into the local and the reduced
        (global) gradients, e.g. to take a norm of each part separately: the
        global part is the same on every rank, the local part is not.

        Args:
            target, sources, output_gradients, unconnected_gradients: as gradient().

        Returns:
            A tuple (local_vars_grads, global_vars_grads), as in Horovod: two
            lists of (source, gradient) pairs, for the registered local
            sources and for the other sources, each in the order of the
            flattened `sources`.

        Example:
            >>> local_vars_grads, global_vars_grads = tape.get_local_and_global_gradients(
            ...     loss, variables)
            >>> global_norm = tf.linalg.global_norm([g for _, g in global_vars_grads])
            >>> for var, grad in local_vars_grads:
            ...     var.assign_sub(lr * grad)
        """
        grads = self.gradient(target, sources, output_gradients=output_gradients,
                              unconnected_gradients=unconnected_gradients)
        local, shared = [], []
        for source, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(grads)):
            (local if self._tfring_reducer.is_local(source) else shared).append((source, grad))
        return local, shared


def _wrap(gradtape, reducer):
    cls = type(gradtape.__class__.__name__, (_DistributedTapeMixin, gradtape.__class__), {})
    tape = cls.__new__(cls)
    # Share the recorded state: the wrapper is usually made after the `with`
    # block that recorded the computation.
    tape.__dict__.update(gradtape.__dict__)
    tape._tfring_reducer = reducer
    return tape


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False,
                            op=mpi_ops.Average, gradient_predivide_factor=1.0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape so that gradient() averages across ranks.

    In eager mode each call reduces all gradients in one grouped request; in
    tf.function they are separate ops that the core fuses.

    Args:
        gradtape: the tf.GradientTape (before or after recording).
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: Compression.none, fp16 or bf16 (tfring.tensorflow.compression).
        sparse_as_dense: reduce IndexedSlices gradients as dense tensors.
        op: hvd.Average (default), hvd.Sum or hvd.Adasum (gradients are
            combined with Adasum; see allreduce).
        gradient_predivide_factor: see GradientReducer.
        groups: None, a number of groups, or lists of variables reduced together.
        process_set: the ranks that reduce; on ranks outside it gradient()
            returns the local gradients, as in Horovod.

    Returns:
        A tape of the same class whose gradient() returns reduced gradients.
        Its register_local_source(v) keeps v's gradient local, and
        get_local_and_global_gradients() returns the two parts apart.

    Raises:
        ValueError: a bad op or predivide factor.

    Example:
        >>> with tf.GradientTape() as tape:
        ...     loss = loss_fn(model(x), y)
        >>> tape = hvd.DistributedGradientTape(tape)
        >>> grads = tape.gradient(loss, model.trainable_variables)
    """
    reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor,
                              groups, process_set, scale_local_gradients=scale_local_gradients,
                              name="DistributedGradientTape")
    return _wrap(gradtape, reducer)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=mpi_ops.Average, gradient_predivide_factor=1.0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """Like DistributedGradientTape, but gradients of `local_layers`' variables
    stay local to each rank (divided by size when scale_local_gradients).

    Args:
        local_layers: a Keras layer or a list of them whose weights are local.
        Other arguments: as DistributedGradientTape.

    Returns:
        The wrapped tape.

    Example:
        >>> tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.layers[-1]])
    """
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    local_vars = [v for layer in local_layers for v in layer.trainable_weights]
    reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor,
                              groups, process_set, local_variables=local_vars,
                              scale_local_gradients=scale_local_gradients,
                              name="PartialDistributedGradientTape")
    return _wrap(gradtape, reducer)
