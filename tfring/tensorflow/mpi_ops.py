"""TensorFlow wrappers of tfring's collective ops (their gradients: gradients.py).

Each collective is keyed by name: every rank must submit a tensor of the same
name for it to run. Names default to the TF op name, which is what a graph
built the same way on every rank gives; in eager mode ops run one at a time,
so the default name is enough there too.
"""
import tensorflow as tf

from tfring.common import basics
from tfring.common.compression import check_compression, predivide_plan
from tfring.common.process_sets import global_process_set
from tfring.tensorflow.op_calls import (as_tensor, check_dtype, collective,
                                        default_name, normalize_name, ops, per_dtype,
                                        set_id, typed_errors)

# Reduce ops: the same numbering as Horovod (and as the reduce_op attribute).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

def _check_reduce_op(op, prescale_factor, postscale_factor, what):
    if op == Adasum and what.endswith("reducescatter"):
        raise NotImplementedError(f"{what} does not support Adasum (Horovod neither); Adasum is "
                                  "an allreduce. Use op=Average or op=Sum.")
    if op not in _OP_NAMES:
        raise ValueError(f"{what}: unknown reduce op {op!r}; use hvd.Average, Sum, Adasum, Min, "
                         "Max or Product.")
    if (prescale_factor != 1.0 or postscale_factor != 1.0) and op not in (Average, Sum, Adasum):
        raise ValueError(f"{what}: prescale/postscale factors need op=Average, Sum or Adasum, "
                         f"not {_OP_NAMES[op]}.")


ADASUM_DTYPES = (tf.float16, tf.float32, tf.float64)


def _check_adasum(tensors, process_set):
    """Refuses, before anything is submitted, what Horovod refuses for Adasum
    on CPU: non-global process sets and a number of ranks that is not a power
    of two (the pairwise tree needs one). Adasum combines floating-point
    vectors only."""
    for t in tensors:
        if t.dtype.base_dtype not in ADASUM_DTYPES:
            raise tf.errors.InvalidArgumentError(
                None, None, f"tfring Adasum supports float16, float32 and float64 tensors, not "
                f"{t.dtype.name}.")
    if process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    n = process_set.size()
    if n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set):
    """Raw allreduce of one dense tensor; averaging and scaling happen in the core."""
    basics._require_init()
    tensor = as_tensor(tensor)
    check_dtype(tensor, "allreduce")
    _check_reduce_op(op, prescale_factor, postscale_factor, "allreduce")
    if op == Adasum:
        _check_adasum([tensor], process_set)
    return collective(
        "Allreduce", tensor, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
        process_set_id=set_id(process_set), name=name,
        graph_name=default_name("HorovodAllreduce", tensor, name))


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    """Allreduces a list of dense tensors as one request per dtype."""
    basics._require_init()
    _check_reduce_op(op, prescale_factor, postscale_factor, "grouped_allreduce")
    if op == Adasum:
        _check_adasum([tf.convert_to_tensor(t) for t in tensors], process_set)
    return per_dtype(tensors, "grouped_allreduce", name, "HorovodGroupedAllreduce",
                      lambda group, group_name: collective(
                          "GroupedAllreduce", group, reduce_op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          ignore_name_scope=ignore_name_scope,
                          process_set_id=set_id(process_set),
                          name=group_name, graph_name=group_name))


_ADASUM_SPARSE = ("Adasum does not support sparse tensors (tf.IndexedSlices); pass "
                  "sparse_as_dense=True to the DistributedOptimizer or DistributedGradientTape, "
                  "or convert them with tf.convert_to_tensor.")


def _resolve_op(op, average, default=Average):
    if average is not None:
        if op is not None:
            raise ValueError("allreduce: pass either op or the deprecated average, not both.")
        return Average if average else Sum
    return default if op is None else op


def _predivide(tensors, compression, op, prescale_factor, process_set):
    """Applies a predividing compressor's rule (tfring.common.compression):
    returns the tensors (multiplied by prescale/size when it applies), op
    and prescale factor to reduce them with. It applies only when every
    tensor is floating point, since one request has one op."""
    if not getattr(compression, "predivide", False) or not tensors or not all(
            t.dtype.is_floating for t in tensors):
        return tensors, op, prescale_factor
    factor, op, prescale_factor = predivide_plan(compression, op, Average, Sum, prescale_factor,
                                                 process_set.size)
    if factor is not None:
        tensors = [t * tf.constant(factor, t.dtype) for t in tensors]
    return tensors, op, prescale_factor


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None,
              process_set=global_process_set, ignore_name_scope=False):
    """Reduces a tensor over all ranks of a process set.

    Args:
        tensor: a tf.Tensor, tf.Variable or tf.IndexedSlices.
        average: deprecated; use op.
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: Compression.none (default), Compression.fp16 or
            Compression.bf16 (see tfring.tensorflow.compression).
        op: hvd.Average (default), Sum, Adasum, Min, Max or Product.
            IndexedSlices support Average and Sum only. Adasum (adaptive
            summation, Maleki et al. 2020) combines two ranks' tensors a, b
            as (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b, pairwise up a
            binary tree of ranks: orthogonal gradients add up, parallel ones
            are averaged, so it helps when large effective batches (many
            ranks) would otherwise need a retuned learning rate, and it
            changes nothing useful when gradients are nearly parallel
            anyway. Apply it to gradients with the learning rate of a single
            rank. It needs a power-of-two number of ranks, the global
            process set and float16/32/64 tensors; each tensor of a grouped
            or fused request gets its own coefficients.
        prescale_factor, postscale_factor: multiply before / after the sum.
        name: the collective's name; the same on every rank.
        process_set: the ranks taking part (default: all).
        ignore_name_scope: key the collective by the name without its scope.

    Returns:
        A tensor of the same shape and dtype (an IndexedSlices for one).

    Raises:
        tf.errors.FailedPreconditionError: ranks disagree on shape, dtype or op.
        tf.errors.InvalidArgumentError: unsupported dtype (for Adasum: not
            float16/32/64).
        NotImplementedError: scale factors or Adasum with IndexedSlices;
            Adasum on a number of ranks that is not a power of two, or on a
            process set other than the global one.

    Example:
        >>> avg = hvd.allreduce(tf.constant([1.0, 2.0]) * (hvd.rank() + 1))
        >>> combined = hvd.allreduce(grad, op=hvd.Adasum)  # 1, 2, 4, 8, ... ranks
    """
    compression = check_compression(compression, "allreduce")
    op = _resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError(_ADASUM_SPARSE)
        if op not in (Average, Sum):
            raise NotImplementedError("allreduce of IndexedSlices supports op=Average or Sum only.")
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("allreduce of IndexedSlices does not support scale factors.")
        with tf.name_scope(name or "HorovodAllreduce"):
            values = allgather(tensor.values, process_set=process_set,
                               ignore_name_scope=ignore_name_scope)
            indices = allgather(tensor.indices, process_set=process_set,
                                ignore_name_scope=ignore_name_scope)
        if op == Average:
            # The size as an op, read when the step runs: a tf.function
            # traced at one size runs on after an elastic reset to another.
            size = size_op(process_set_id=set_id(process_set))
            values = values / tf.cast(size, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = as_tensor(tensor)
    tensors, op, prescale_factor = _predivide([tensor], compression, op, prescale_factor,
                                              process_set)
    compressed, ctx = compression.compress(tensors[0])
    reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, name=None,
                      process_set=global_process_set, ignore_name_scope=False):
    """Reduces a list of tensors in one request; same arguments as allreduce().

    Returns:
        A list of reduced tensors in the input order.

    Example:
        >>> a, b = hvd.grouped_allreduce([tf.ones([2]), tf.zeros([3])], op=hvd.Sum)
    """
    compression = check_compression(compression, "grouped_allreduce")
    op = _resolve_op(op, average)
    tensors = list(tensors)
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i in range(len(tensors)) if i not in sparse]
    results = [None] * len(tensors)
    if sparse and op == Adasum:
        raise NotImplementedError(_ADASUM_SPARSE)
    for i in sparse:
        results[i] = allreduce(tensors[i], op=op, process_set=process_set,
                               ignore_name_scope=ignore_name_scope)
    dense_tensors, op, prescale_factor = _predivide(
        [tf.convert_to_tensor(tensors[i]) for i in dense], compression, op, prescale_factor,
        process_set)
    compressed = [compression.compress(t) for t in dense_tensors]
    reduced = _grouped_allreduce([c[0] for c in compressed], name=name, op=op,
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor,
                                 ignore_name_scope=ignore_name_scope, process_set=process_set)
    for i, r, (_, ctx) in zip(dense, reduced, compressed):
        results[i] = compression.decompress(r, ctx)
    return results


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates a tensor from every rank along the first dimension.

    The first dimension may differ between ranks; the others must agree.

    Args:
        tensor: a tensor with at least one dimension.
        name, ignore_name_scope, process_set: as for allreduce().

    Returns:
        A tensor whose first dimension is the sum over ranks.

    Raises:
        tf.errors.FailedPreconditionError: ranks disagree on dtype or trailing dims.

    Example:
        >>> rows = hvd.allgather(tf.fill([hvd.rank() + 1, 2], hvd.rank()))
    """
    basics._require_init()
    tensor = as_tensor(tensor)
    check_dtype(tensor, "allgather")
    return collective("Allgather", tensor, ignore_name_scope=ignore_name_scope,
                       process_set_id=set_id(process_set), name=name,
                       graph_name=default_name("HorovodAllgather", tensor, name))


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Allgathers a list of tensors (one request per dtype). Returns a list."""
    basics._require_init()
    return per_dtype(tensors, "grouped_allgather", name, "HorovodGroupedAllgather",
                      lambda group, group_name: collective(
                          "GroupedAllgather", group, ignore_name_scope=ignore_name_scope,
                          process_set_id=set_id(process_set),
                          name=group_name, graph_name=group_name))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """Returns the root rank's value of `tensor` on every rank.

    Args:
        tensor: the tensor; only the root's value matters, but every rank's
            must have the same shape and dtype.
        root_rank: the job-wide rank (hvd.rank() of the sender) whose value
            is sent, also with a process set, as in Horovod: with the set
            [1, 2], root_rank=1 sends global rank 1's value.
        name, ignore_name_scope: as for allreduce().
        process_set: the ranks taking part (default: all); root_rank must
            be one of them.

    Returns:
        The root's tensor, on every rank of the set.

    Raises:
        tf.errors.FailedPreconditionError: on every rank, when ranks disagree
            on root, shape or dtype, or the root is not a rank of the set.

    Example:
        >>> w = hvd.broadcast(tf.random.normal([3]), root_rank=0)
        >>> pair = hvd.add_process_set([1, 2])
        >>> if pair.included():
        ...     w = hvd.broadcast(w, root_rank=2, process_set=pair)  # global rank 2's
    """
    basics._require_init()
    tensor = as_tensor(tensor)
    check_dtype(tensor, "broadcast")
    return collective("Broadcast", tensor, root_rank=root_rank,
                       ignore_name_scope=ignore_name_scope,
                       process_set_id=set_id(process_set), name=name,
                       graph_name=default_name("HorovodBroadcast", tensor, name))


def broadcast_(variables, root_rank, name=None, process_set=global_process_set,
               ignore_name_scope=False):
    """Overwrites variables in place with the root rank's values.

    Resource variables (TF2 and Keras variables) are written in place by one
    op each, which holds the variable's lock until the broadcast is done. TF1
    reference variables (graph mode with resource variables disabled) have no
    resource handle: they are assigned the broadcast value instead.

    Args:
        variables: variables in the same order on every rank (resource or
            TF1 reference variables).
        root_rank: the job-wide rank whose values are sent (see broadcast()).
        name: the collectives' name (suffixed _0, _1, ... for several).
        process_set, ignore_name_scope: as for broadcast().

    Returns:
        The variables' values after the broadcast, one tensor each (as
        Horovod). In TF1 graph mode, running them does the broadcast.

    Raises:
        tf.errors.InvalidArgumentError: a variable's dtype is not supported.
        tf.errors.FailedPreconditionError: ranks' variables disagree in shape
            or dtype, or the root is not in the process set.

    Example:
        >>> hvd.broadcast_(model.variables, root_rank=0)
    """
    basics._require_init()
    variables = list(variables)
    values = []
    for i, var in enumerate(variables):
        check_dtype(var, "broadcast_")
        op_name = name
        if op_name is None:
            op_name = f"HorovodBroadcastInplace_{i}" if tf.executing_eagerly() else \
                "HorovodBroadcastInplace_" + normalize_name(var.name)
        elif len(variables) > 1:
            op_name = f"{name}_{i}"
        if not hasattr(var, "handle"):
            # A RefVariable: broadcast its value and assign the result.
            values.append(tf.identity(tf.compat.v1.assign(
                var, broadcast(var, root_rank, name=op_name, ignore_name_scope=ignore_name_scope,
                               process_set=process_set))))
            continue
        op = collective(
            "BroadcastInplaceResource", var.handle, T=tf.as_dtype(var.dtype).base_dtype,
            root_rank=root_rank, ignore_name_scope=ignore_name_scope,
            process_set_id=set_id(process_set), name=op_name, graph_name=op_name)
        # A graph needs the read ordered after the broadcast; eagerly it already is.
        with tf.control_dependencies([op] if op is not None else []):
            values.append(tf.identity(var))
    return values


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Sends rows of `tensor` to every rank and receives theirs.

    Args:
        tensor: rows are sent in order: the first splits[0] to rank 0, ...
        splits: rows for each rank (int32, one per rank). None splits evenly,
            which needs a first dimension divisible by the number of ranks.

    Returns:
        Without splits, the received tensor. With splits, a tuple
        (received tensor, received_splits).

    Raises:
        tf.errors.InvalidArgumentError: on this rank, at once (before anything
            is sent): splits that do not add up to the first dimension, do not
            have one entry per rank of the set, or are negative; without
            splits, a first dimension not divisible by the number of ranks.
        tf.errors.FailedPreconditionError: ranks disagree on dtype or trailing dims.
        ValueError: the process set is not registered.

    Example:
        >>> out, received = hvd.alltoall(tf.range(4), splits=[1, 3])
    """
    basics._require_init()
    tensor = as_tensor(tensor)
    check_dtype(tensor, "alltoall")
    splits_t = tf.zeros([0], tf.int32) if splits is None else tf.cast(splits, tf.int32)
    out, received = collective(
        "Alltoall", tensor, splits_t, ignore_name_scope=ignore_name_scope,
        process_set_id=set_id(process_set), name=name,
        graph_name=default_name("HorovodAlltoall", tensor, name))
    return out if splits is None else (out, received)


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces over ranks and leaves each rank its block of rows.

    With R rows and N ranks, the first R mod N ranks get one extra row.

    The gradient follows Horovod's convention, so that models ported from it
    train the same: with upstream gradients g_r (rank r's rows), the gradient
    of the input is N * allgather(g) for op=Sum and allgather(g) for
    op=Average (times prescale_factor * postscale_factor), on every rank.
    That is N times the derivative of the sum of the ranks' losses; Min, Max
    and Product have no gradient.

    Args:
        tensor: a tensor with at least one dimension, the same shape on
            every rank.
        device_dense: accepted for Horovod compatibility.
        compression: Compression.none (default), Compression.fp16 or
            Compression.bf16 (see tfring.tensorflow.compression).
        op: hvd.Average (default), Sum, Min, Max or Product.
        name, process_set, ignore_name_scope: as for allreduce().
        prescale_factor, postscale_factor: multiply before / after the sum.

    Returns:
        This rank's rows of the reduced tensor.

    Raises:
        tf.errors.FailedPreconditionError: ranks disagree on shape, dtype or op.
        ValueError: an unknown op, or scale factors with Min, Max or Product.
        NotImplementedError: op=Adasum; and, when differentiated, Min, Max or
            Product.

    Example:
        >>> part = hvd.reducescatter(tf.ones([4, 2]), op=hvd.Sum)
    """
    compression = check_compression(compression, "reducescatter")
    basics._require_init()
    _check_reduce_op(op, prescale_factor, postscale_factor, "reducescatter")
    tensor = as_tensor(tensor)
    scaled, op, prescale_factor = _predivide([tensor], compression, op, prescale_factor,
                                             process_set)
    compressed, ctx = compression.compress(scaled[0])
    check_dtype(compressed, "reducescatter")
    out = collective(
        "Reducescatter", compressed, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, ignore_name_scope=ignore_name_scope,
        process_set_id=set_id(process_set), name=name,
        graph_name=default_name("HorovodReducescatter", tensor, name))
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=None, op=Average, name=None,
                          process_set=global_process_set, ignore_name_scope=False,
                          prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatters a list of tensors as one request per dtype; arguments,
    gradient convention and errors as for reducescatter().

    Returns:
        A list of this rank's rows of each reduced tensor, in input order.

    Example:
        >>> a, b = hvd.grouped_reducescatter([tf.ones([4, 2]), tf.ones([6])], op=hvd.Sum)
    """
    basics._require_init()
    _check_reduce_op(op, prescale_factor, postscale_factor, "grouped_reducescatter")
    return per_dtype(tensors, "grouped_reducescatter", name, "HorovodGroupedReducescatter",
                      lambda group, group_name: collective(
                          "GroupedReducescatter", group, reduce_op=op,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                          ignore_name_scope=ignore_name_scope,
                          process_set_id=set_id(process_set),
                          name=group_name, graph_name=group_name))


def join(process_set=global_process_set):
    """Waits until every rank has called join(); meanwhile other ranks'
    allreduces count this rank as zeros.

    Returns:
        The last rank that joined (an int in eager mode, else a tensor).

    Example:
        >>> for batch in my_uneven_share_of_data: train_step(batch)
        >>> hvd.join()
    """
    basics._require_init()
    if not tf.executing_eagerly():
        return ops().horovod_join(process_set_id=set_id(process_set))
    with typed_errors():
        return int(ops().horovod_join(process_set_id=set_id(process_set)).numpy())


def barrier(process_set=global_process_set, name=None):
    """Blocks until every rank of the process set reaches the barrier.

    Example:
        >>> hvd.barrier()
    """
    basics._require_init()
    return collective("Barrier", process_set_id=set_id(process_set), name=name,
                       graph_name=name)


def size_op(process_set_id=0, name=None):
    """Graph op returning the number of ranks in the process set."""
    return ops().horovod_size(process_set_id=process_set_id, name=name)


def rank_op(process_set_id=0, name=None):
    """Graph op returning this process's rank in the process set."""
    return ops().horovod_rank(process_set_id=process_set_id, name=name)


def local_size_op(name=None):
    """Graph op returning the number of ranks on this host."""
    return ops().horovod_local_size(name=name)


def local_rank_op(name=None):
    """Graph op returning this process's rank on its host."""
    return ops().horovod_local_rank(name=name)


def process_set_included_op(process_set_id=0, name=None):
    """Graph op returning 1 if this process is in the process set, else 0."""
    return ops().horovod_process_set_included(process_set_id=process_set_id, name=name)
