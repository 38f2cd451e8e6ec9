"""How gradients are combined across ranks; shared by DistributedGradientTape,
the TF1 DistributedOptimizer and the Keras DistributedOptimizer.

`GradientReducer` averages (or sums) a list of gradients across ranks.
`LocalGradientAggregator` implements backward_passes_per_step: it sums
gradients locally for N backward passes and lets the update through (with
reduced gradients) only on the Nth.
"""
import tensorflow as tf

from tfring.common.process_sets import global_process_set
from tfring.tensorflow import mpi_ops
from tfring.common.compression import check_compression
from tfring.tensorflow.compression import Compression


class GradientReducer:
    """Reduces gradients across the ranks of a process set.

    Args:
        compression: Compression.none, fp16, bf16 or powersgd(...).
        sparse_as_dense: reduce IndexedSlices as dense tensors (one allreduce)
            instead of two allgathers.
        op: hvd.Average, hvd.Sum or hvd.Adasum (see mpi_ops.allreduce).
        gradient_predivide_factor: with Average, divide by this before the sum
            and by size/factor after, to keep large sums in range.
        groups: None, a number of groups, or a list of lists of variables; each
            group is reduced as one request.
        process_set: the ranks that reduce. On a rank outside the set the
            gradients stay local (Horovod's behaviour), so one training
            script can serve members and non-members alike.
        local_variables: variables whose gradients stay local (not reduced);
            divided by size when `scale_local_gradients`.

    Raises:
        ValueError: a bad op, predivide factor or group.
        TypeError: `compression` is not a compressor.
    """

    def __init__(self, compression=Compression.none, sparse_as_dense=False, op=mpi_ops.Average,
                 gradient_predivide_factor=1.0, groups=None, process_set=global_process_set,
                 local_variables=(), scale_local_gradients=True, name="DistributedGradients"):
        if op not in (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Adasum):
            raise ValueError("Gradients can be reduced with op=hvd.Average, hvd.Sum or "
                             "hvd.Adasum only.")
        if gradient_predivide_factor != 1.0 and op != mpi_ops.Average:
            raise ValueError("gradient_predivide_factor needs op=hvd.Average.")
        if isinstance(groups, int) and groups <= 0:
            raise ValueError("groups must be a positive number of groups or a list of lists.")
        self.compression = check_compression(compression, name, stateful_ok=True)
        if getattr(self.compression, "stateful", False):
            self.compression.check_reduction(op == mpi_ops.Average, name)
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.prescale = 1.0 / gradient_predivide_factor
        self.postscale = gradient_predivide_factor
        self.groups = groups
        self.process_set = process_set
        # Keyed by id(), since Keras 3 variables have no .ref(); the objects are
        # kept so that an id cannot be reused by another object meanwhile.
        self.local_refs = {id(v): v for v in local_variables}
        self.scale_local_gradients = scale_local_gradients
        self.name = name

    def _mean(self, tensors):
        """Averages `tensors` across the set as one request (for PowerSGD)."""
        return mpi_ops.grouped_allreduce(tensors, op=mpi_ops.Average,
                                         prescale_factor=self.prescale,
                                         postscale_factor=self.postscale,
                                         process_set=self.process_set)

    def add_local_variables(self, variables):
        """Keeps the gradients of `variables` (or watched tensors) local from now on."""
        self.local_refs.update((id(v), v) for v in variables)

    def is_local(self, variable):
        return id(variable) in self.local_refs

    def _group_indices(self, indices, variables):
        """Splits gradient indices into the requests they are reduced in."""
        if self.groups is None:
            # Eager ops run one at a time, so one grouped request per step
            # avoids a negotiation round trip per gradient. In a graph the ops
            # are concurrent and the core fuses them by itself.
            return [indices] if tf.executing_eagerly() else [[i] for i in indices]
        if isinstance(self.groups, int):
            n = min(self.groups, max(len(indices), 1))
            return [indices[k::n] for k in range(n) if indices[k::n]]
        by_ref = {}
        for g, group in enumerate(self.groups):
            for var in group:
                by_ref[id(var)] = g
        buckets = {}
        for i in indices:
            key = by_ref.get(id(variables[i]), ("own", i)) if variables is not None else ("own", i)
            buckets.setdefault(key, []).append(i)
        return list(buckets.values())

    def __call__(self, grads, variables=None):
        """Returns `grads` reduced across ranks, in order; None stays None."""
        grads = list(grads)
        variables = list(variables) if variables is not None else None
        out = list(grads)
        local = set()
        if variables is not None and self.local_refs:
            local = {i for i, v in enumerate(variables) if id(v) in self.local_refs}
        member = self.process_set.included()
        with tf.name_scope(self.name):
            dense, sparse = [], []
            for i, g in enumerate(grads):
                if g is None or i in local:
                    continue
                if isinstance(g, tf.IndexedSlices) and self.sparse_as_dense:
                    out[i] = grads[i] = g = tf.convert_to_tensor(g)
                if not member:
                    continue
                (sparse if isinstance(g, tf.IndexedSlices) else dense).append(i)
            for i in sparse:
                out[i] = mpi_ops.allreduce(grads[i], op=self.op, process_set=self.process_set)
            if dense and getattr(self.compression, "stateful", False):
                # PowerSGD: all of the step's gradients at once, in two requests.
                for i, r in zip(dense, self.compression.reduce(grads, dense, self._mean)):
                    out[i] = r
                dense = []
            for group in self._group_indices(dense, variables) if dense else []:
                if len(group) == 1 and self.groups is None:
                    reduced = [mpi_ops.allreduce(
                        grads[group[0]], op=self.op, compression=self.compression,
                        prescale_factor=self.prescale, postscale_factor=self.postscale,
                        process_set=self.process_set)]
                else:
                    reduced = mpi_ops.grouped_allreduce(
                        [grads[i] for i in group], op=self.op, compression=self.compression,
                        prescale_factor=self.prescale, postscale_factor=self.postscale,
                        process_set=self.process_set)
                for i, r in zip(group, reduced):
                    out[i] = r
            if self.scale_local_gradients:
                for i in local:
                    out[i] = _divide(out[i], self.process_set.size())
        return out


def _divide(grad, n):
    """grad / n for a dense or IndexedSlices gradient (None stays None)."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


class LocalGradientAggregator:
    """Sums gradients over `backward_passes_per_step` backward passes and
    runs the update on every Nth with the reduced sum (or mean).

    Works in eager mode, inside tf.function and in TF1 graphs: the decision is
    a Python `if` when eager and a tf.cond otherwise. Every rank counts the
    same passes, so all ranks reduce on the same step.
    """

    def __init__(self, backward_passes_per_step, reducer, average_aggregated_gradients=False):
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be >= 1.")
        self.passes = backward_passes_per_step
        self.reducer = reducer
        self.average = average_aggregated_gradients
        self.counter = None
        self.accumulators = None

    def _create_variables(self, grads):
        # init_scope lifts creation out of tf.function and tf.cond.
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                       name="tfring_backward_passes")
            self.accumulators = [
                None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False,
                                                   name="tfring_aggregated_gradient")
                for g in grads]

    def step(self, grads, variables, apply_fn, skip_fn):
        """Accumulates `grads`; on every Nth call runs apply_fn(reduced_grads),
        otherwise skip_fn(). Both return nothing."""
        grads = list(grads)
        for g in grads:
            if isinstance(g, tf.IndexedSlices) and not self.reducer.sparse_as_dense:
                raise ValueError("backward_passes_per_step > 1 needs dense gradients; pass "
                                 "sparse_as_dense=True.")
        grads = [tf.convert_to_tensor(g) if g is not None else None for g in grads]
        if self.counter is None:
            self._create_variables(grads)
        updates = [acc.assign_add(g) for acc, g in zip(self.accumulators, grads) if g is not None]
        with tf.control_dependencies(updates):
            count = self.counter.assign_add(1)

        def reduce_and_apply():
            summed = [None if acc is None else acc.read_value() for acc in self.accumulators]
            if self.average:
                summed = [None if s is None else s / self.passes for s in summed]
            reduced = self.reducer(summed, variables)
            with tf.control_dependencies([r for r in reduced if r is not None]):
                apply_op = apply_fn(reduced)
            with tf.control_dependencies([apply_op] if apply_op is not None else []):
                resets = [acc.assign(tf.zeros_like(acc)) for acc in self.accumulators
                          if acc is not None]
                resets.append(self.counter.assign(0))
            return tf.group(*resets)

        def skip():
            op = skip_fn()
            return tf.group(op) if op is not None else tf.no_op()

        if tf.executing_eagerly():
            return reduce_and_apply() if int(count) % self.passes == 0 else skip()
        with tf.control_dependencies([count]):
            return tf.cond(tf.equal(count % self.passes, 0), reduce_and_apply, skip)
