"""Helpers built on the collectives: broadcasting variables and Python objects."""
import cloudpickle
import numpy as np
import tensorflow as tf

from tfring.common import basics
from tfring.common.process_sets import global_process_set
from tfring.tensorflow import mpi_ops

def _broadcast_in_one_function(variables, root_rank, process_set):
    """Broadcasts inside one tf.function, so all the broadcasts are negotiated
    in one cycle instead of one round trip per variable. The variables are
    captured, not passed: Keras 3 variables passed as tf.function arguments
    become read-only tensors."""
    @tf.function
    def broadcast_all():
        for i, var in enumerate(variables):
            var.assign(mpi_ops.broadcast(var, root_rank, name=f"tfring_broadcast_variable_{i}",
                                         process_set=process_set))
    broadcast_all()


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Sets every variable to the root rank's value.

    Args:
        variables: tf.Variables (the same list, in the same order, on every
            rank); in TF1 graph mode also reference variables.
        root_rank: the job-wide rank whose values win, also with a process
            set (as in Horovod); it must be one of the set's ranks.
        process_set: the ranks taking part.
        inplace: write into the variables' buffers directly instead of assigning.

    Returns:
        In graph mode, the op that does it; in eager mode, None.

    Raises:
        tf.errors.FailedPreconditionError: ranks' variables disagree in shape or
            dtype, or root_rank is not a rank of the process set.

    Example:
        >>> hvd.broadcast_variables(model.variables, root_rank=0)
    """
    variables = list(variables)
    if not variables:
        return None
    if inplace:
        values = mpi_ops.broadcast_(variables, root_rank, process_set=process_set)
        return None if tf.executing_eagerly() else tf.group(*values)
    if tf.executing_eagerly():
        _broadcast_in_one_function(variables, root_rank, process_set)
        return None
    return tf.group(*[var.assign(mpi_ops.broadcast(var, root_rank, process_set=process_set))
                      for var in variables])


def broadcast_global_variables(root_rank):
    """TF1 graph mode: the op that broadcasts all global variables from `root_rank`.

    Raises:
        RuntimeError: in eager mode, where there are no global variables.
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() works in TF1 graph mode only; in TF2 call "
            "hvd.broadcast_variables(model.variables, root_rank=0) instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """SessionRunHook that broadcasts all global variables from `root_rank`
    once the session is created (also after restoring from a checkpoint), so
    every rank starts from the same state.

    Args:
        root_rank: the rank whose values win.
        device: accepted for Horovod compatibility.

    Example:
        >>> hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        >>> with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess: ...
    """

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


def _session_for(session):
    """The session that runs an object collective: None in eager mode; in a
    graph, `session` or else the default session, as Horovod does. Resolved
    before any op is built, so a missing session costs no communication."""
    if tf.executing_eagerly():
        return None
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise RuntimeError(
            "In graph mode, object collectives need a session to run in: pass session=, or "
            "call them inside `with tf.compat.v1.Session():` (the default session is used).")
    return session


def _run(tensor, session):
    return tensor.numpy() if session is None else session.run(tensor)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Sends a picklable Python object from `root_rank` to every rank.

    Args:
        obj: any cloudpickle-able object (only the root's matters).
        root_rank: the sending rank: a job-wide rank, also with a process
            set (as in Horovod).
        session: in TF1 graph mode, the tf.compat.v1.Session that runs the
            collectives (default: the default session). Ignored in eager mode.
        name: a name for the collectives.
        process_set: the ranks taking part; root_rank must be one of them.

    Returns:
        The root's object, on every rank.

    Raises:
        tf.errors.FailedPreconditionError: root_rank is not a rank of the set.
        RuntimeError: in graph mode with neither session= nor a default session.

    Example:
        >>> config = hvd.broadcast_object(config if hvd.rank() == 0 else None)
        >>> with tf.compat.v1.Session():   # TF1 graph mode: the default session runs it
        ...     config = hvd.broadcast_object(config)
    """
    basics._require_init()
    session = _session_for(session)
    name = name or "broadcast_object"
    is_root = basics.rank() == root_rank
    if is_root:
        payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    else:
        payload = np.zeros([0], dtype=np.uint8)
    length = mpi_ops.broadcast(tf.constant([payload.size], tf.int64), root_rank,
                               name=f"{name}_size", process_set=process_set)
    length = int(_run(length, session)[0])
    if not is_root:
        payload = np.zeros([length], dtype=np.uint8)
    data = mpi_ops.broadcast(tf.constant(payload), root_rank, name=f"{name}_data",
                             process_set=process_set)
    return cloudpickle.loads(_run(data, session).tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Returns a function that broadcasts its argument like broadcast_object().

    In graph mode, a session left out is looked up when the function is
    called: the default session then.

    Args:
        root_rank, session, name, process_set: as for broadcast_object().

    Returns:
        A function obj -> the root's obj.

    Example:
        >>> sync = hvd.broadcast_object_fn(root_rank=0)
        >>> epoch = sync(epoch)
    """
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Gathers a picklable Python object from every rank.

    Args:
        obj: any cloudpickle-able object.
        session: in TF1 graph mode, the tf.compat.v1.Session that runs the
            collectives (default: the default session). Ignored in eager mode.
        name: a name for the collectives.

    Returns:
        A list with one object per rank, in rank order.

    Raises:
        RuntimeError: in graph mode with neither session= nor a default session.

    Example:
        >>> counts = hvd.allgather_object(len(my_shard))
    """
    basics._require_init()
    session = _session_for(session)
    name = name or "allgather_object"
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = mpi_ops.allgather(tf.constant([payload.size], tf.int64), name=f"{name}_sizes",
                              process_set=process_set)
    sizes = _run(sizes, session)
    data = _run(mpi_ops.allgather(tf.constant(payload), name=f"{name}_data",
                                  process_set=process_set), session)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [cloudpickle.loads(data[offsets[i]:offsets[i + 1]].tobytes())
            for i in range(len(sizes))]
