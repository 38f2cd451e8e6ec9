"""Collectives on Keras values (tensors, numpy arrays, Python numbers)."""
import tensorflow as tf

from tfring.common.process_sets import global_process_set
from tfring.tensorflow import functions, mpi_ops


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=None, process_set=global_process_set):
    """Reduces a value over ranks (default: average). Returns a tensor.

    Example:
        >>> mean_loss = hvd.allreduce(loss_value, name="loss")
    """
    return mpi_ops.allreduce(tf.convert_to_tensor(value), average=average, name=name, op=op,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             compression=compression, process_set=process_set)


def allgather(value, name=None, process_set=global_process_set):
    """Concatenates a value from every rank along its first dimension. Returns a tensor."""
    return mpi_ops.allgather(tf.convert_to_tensor(value), name=name, process_set=process_set)


def broadcast(value, root_rank, name=None, process_set=global_process_set):
    """Returns the root rank's value on every rank, as a tensor.

    Args:
        value: a tensor, numpy array or Python number.
        root_rank: the job-wide rank whose value is sent, also with a process
            set (as in Horovod); it must be one of the set's ranks.
        name: the collective's name.
        process_set: the ranks taking part (default: all).

    Returns:
        The root's value, as a tensor.

    Raises:
        tf.errors.FailedPreconditionError: ranks disagree on root, shape or
            dtype, or the root is not a rank of the set.

    Example:
        >>> lr = hvd.broadcast(lr, root_rank=0)
    """
    return mpi_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                             process_set=process_set)


def reducescatter(value, name=None, op=mpi_ops.Average, process_set=global_process_set):
    """Reduces over ranks and returns this rank's block of rows."""
    return mpi_ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op,
                                 process_set=process_set)


def broadcast_global_variables(root_rank, model=None):
    """Broadcasts variables from `root_rank`.

    In TF1 graph mode this is every global variable (as Horovod does). In TF2
    there are no global variables, so pass the model: its variables and its
    optimizer's are broadcast.

    Raises:
        ValueError: in TF2 without a model.
    """
    if not tf.executing_eagerly():
        return functions.broadcast_global_variables(root_rank)
    if model is None:
        raise ValueError("In TF2, pass the model: broadcast_global_variables(0, model=model).")
    # model.weights, not model.variables: Keras 3 counts random-seed states
    # among the latter, and dropout masks should keep differing by rank.
    variables = list(model.weights)
    if getattr(model, "optimizer", None) is not None:
        variables += optimizer_variables(model.optimizer)
    return functions.broadcast_variables(variables, root_rank)


def optimizer_variables(optimizer):
    """The optimizer's variables as a list (a property in Keras 3 and tf_keras's
    optimizer, a method in tf_keras's legacy optimizers); [] before it is built."""
    variables = getattr(optimizer, "variables", [])
    if callable(variables):
        variables = variables()
    return list(variables)
