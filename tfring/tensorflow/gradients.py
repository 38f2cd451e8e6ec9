"""The gradients of tfring's collective ops, registered with TensorFlow when
tfring.tensorflow is imported.

Horovod's conventions (kept so that existing models train the same way):
allreduce's gradient follows its op; allgather and broadcast use the mean of
the upstream gradients over ranks; reducescatter's is size times the
allgathered upstream gradient (see mpi_ops.reducescatter()).
"""
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

from tfring.common import basics
from tfring.common.process_sets import global_process_set
from tfring.tensorflow.mpi_ops import (_OP_NAMES, Average, Sum, _allreduce, _grouped_allreduce,
                                       allgather, alltoall, grouped_allgather)


def _set_from_op(op):
    from tfring.common.process_sets import ProcessSet
    ps_id = op.get_attr("process_set_id")
    if ps_id == 0:
        return global_process_set
    ps = ProcessSet([])
    ps.process_set_id = ps_id
    return ps


def _reduction_attrs(op):
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Average, Sum):
        raise NotImplementedError(
            f"tfring: the gradient of a {_OP_NAMES.get(reduce_op, reduce_op)} reduction is not "
            "defined; only Average and Sum are differentiable.")
    return reduce_op, op.get_attr("prescale_factor"), op.get_attr("postscale_factor")


@tf_ops.RegisterGradient("HorovodAllreduce")
def _allreduce_grad(op, grad):
    reduce_op, pre, post = _reduction_attrs(op)
    return _allreduce(grad, op=reduce_op, prescale_factor=pre, postscale_factor=post,
                      process_set=_set_from_op(op))


@tf_ops.RegisterGradient("HorovodGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    reduce_op, pre, post = _reduction_attrs(op)
    return _grouped_allreduce(list(grads), op=reduce_op, prescale_factor=pre,
                              postscale_factor=post, process_set=_set_from_op(op))


def _own_rows(op, reduced, x):
    """This rank's rows of an allgathered gradient."""
    ps = _set_from_op(op)
    rows = tf.shape(x, out_type=tf.int64)[:1]
    all_rows = allgather(rows, process_set=ps)
    offsets = tf.cumsum(all_rows, exclusive=True)
    me = ps.rank()
    begin = tf.concat([offsets[me:me + 1], tf.zeros([tf.rank(x) - 1], tf.int64)], axis=0)
    size = tf.concat([rows, tf.shape(x, out_type=tf.int64)[1:]], axis=0)
    return tf.slice(reduced, begin, size)


@tf_ops.RegisterGradient("HorovodAllgather")
def _allgather_grad(op, grad):
    reduced = _allreduce(grad, op=Average, process_set=_set_from_op(op))
    return _own_rows(op, reduced, op.inputs[0])


@tf_ops.RegisterGradient("HorovodGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    reduced = _grouped_allreduce(list(grads), op=Average, process_set=_set_from_op(op))
    return [_own_rows(op, r, x) for r, x in zip(reduced, op.inputs)]


@tf_ops.RegisterGradient("HorovodBroadcast")
def _broadcast_grad(op, grad):
    reduced = _allreduce(grad, op=Average, process_set=_set_from_op(op))
    if basics.rank() == op.get_attr("root_rank"):  # a job-wide rank, like the attribute
        return reduced
    # Every rank must still submit the allreduce, or the root waits forever.
    # With a static shape tf.zeros_like(reduced) is a constant that does not
    # depend on `reduced`, so a TF1 Session would never run the allreduce here.
    with tf.control_dependencies([reduced]):
        return tf.zeros_like(reduced)


@tf_ops.RegisterGradient("HorovodAlltoall")
def _alltoall_grad(op, grad, _):
    back, _ = alltoall(grad, splits=op.outputs[1], process_set=_set_from_op(op))
    return [back, None]


def _reducescatter_input_grad(op, grad, gathered):
    # Horovod's convention, which existing models' gradients depend on: Sum
    # gives size * allgather(grad) and Average allgather(grad), i.e. `size`
    # times the derivative of the sum of the ranks' losses.
    reduce_op, pre, post = _reduction_attrs(op)
    scale = pre * post * (_set_from_op(op).size() if reduce_op == Sum else 1)
    return gathered if scale == 1.0 else gathered * tf.cast(scale, gathered.dtype)


@tf_ops.RegisterGradient("HorovodReducescatter")
def _reducescatter_grad(op, grad):
    return _reducescatter_input_grad(op, grad, allgather(grad, process_set=_set_from_op(op)))


@tf_ops.RegisterGradient("HorovodGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    gathered = grouped_allgather(list(grads), process_set=_set_from_op(op))
    return [_reducescatter_input_grad(op, g, x) for g, x in zip(grads, gathered)]


def _register_eager_twin_gradients():
    """The TfringNamed* ops (eager mode) differentiate like their Horovod
    counterparts; their extra last input, the name, gets no gradient."""
    for kind in ("Allreduce", "GroupedAllreduce", "Allgather", "GroupedAllgather", "Broadcast",
                 "Alltoall", "Reducescatter", "GroupedReducescatter"):
        horovod_grad = tf_ops.gradient_registry.lookup(f"Horovod{kind}")

        def twin_grad(op, *grads, horovod_grad=horovod_grad):
            out = horovod_grad(op, *grads)
            return (list(out) if isinstance(out, (list, tuple)) else [out]) + [None]
        tf_ops.RegisterGradient(f"TfringNamed{kind}")(twin_grad)


_register_eager_twin_gradients()
