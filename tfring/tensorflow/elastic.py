"""Elastic training for TensorFlow: ``hvd.elastic.run`` and its state classes,
with Horovod's names (``horovod.tensorflow.elastic``). See docs/elastic.md.

Example::

    import tfring.tensorflow as hvd
    hvd.init()
    model, opt = build()
    state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0)

    @hvd.elastic.run
    def train(state):
        while state.batch < total_batches:
            train_step(...)
            state.batch += 1
            state.commit()

    train(state)
"""
import tensorflow as tf

from tfring.common import basics
from tfring.common import elastic as _elastic
from tfring.common import tf_errors
from tfring.common.elastic import State
from tfring.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt, cause_from_core
from tfring.tensorflow import functions, mpi_ops

__all__ = ["run", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState",
           "HorovodInternalError", "HostsUpdatedInterrupt"]


def _is_internal_error(exc):
    """A lost peer: a collective failed because a peer failed or left or the
    job was stopped, as the failure's cause says (also for an error
    TensorFlow raised from inside a graph). A TensorFlow error that carries
    no cause (another op of the graph, cancelled because ours failed) is one
    when tfring has stopped by now: the op that failed first ended the job
    before TensorFlow cancelled the rest. An error raised while handling
    one (autograph's, when the collective failed while tracing) is one too."""
    failure = tf_errors.failure_of(exc)
    if failure is not None:
        return failure[0].ends_job
    # A peer lost while this rank traces a tf.function: autograph re-raises
    # the collective's error as its own StagingError, the error as context.
    context, seen = exc.__context__, 0
    while context is not None and seen < 8:
        failure = tf_errors.failure_of(context)
        if failure is not None:
            return failure[0].ends_job
        context, seen = context.__context__, seen + 1
    return isinstance(exc, tf.errors.OpError) and not basics._core().is_initialized()


def _broadcast(variables):
    # In place, one eager op per variable: a reset (and a new worker's first
    # sync) then traces no function, which costs seconds on a busy machine.
    functions.broadcast_variables(variables, root_rank=0, inplace=True)


def _stop_cause():
    """(Cause, rank or None) of why the core stopped, or None while it runs."""
    code, _, cause, rank = basics._core().check_initialized()[:4]
    if code == 0:
        return None
    return cause_from_core(cause), (rank if rank >= 0 else None)


def _reset():
    basics.shutdown()
    basics.init()


def run(func):
    """Decorates a training function so that it survives lost workers and
    takes in new ones.

    The state is first synced from rank 0. When a peer is lost, every
    survivor restores the last commit, re-forms the job with the driver's
    next round (the oldest surviving worker is rank 0), broadcasts the state
    from rank 0, runs the reset callbacks and calls `func` again. When the
    driver publishes new hosts, the same happens at the next
    ``state.commit()``/``check_host_updates()``, without the rollback. Any
    other exception ends the job: the driver names it and stops every worker.

    Outside a job started by ``tfringrun --host-discovery-script``, `func`
    runs once after the sync, and errors propagate.

    Args:
        func: called as ``func(state, *args, **kwargs)``.

    Returns:
        The wrapped function; it returns what `func` returns.

    Raises:
        Whatever `func` raises that is not a lost peer or a host update.

    Example:
        >>> @hvd.elastic.run
        ... def train(state):
        ...     ...
        >>> train(hvd.elastic.ObjectState(epoch=0))
    """
    return _elastic.run_fn(func, _reset, _is_internal_error, _stop_cause)


class _TensorFlowStateBase(State):
    def _max_across_ranks(self, value):
        return int(mpi_ops.allreduce(tf.constant(value, tf.int64), op=mpi_ops.Max,
                                     name="tfring_elastic_round").numpy())


class ObjectState(_TensorFlowStateBase, _elastic.ObjectState):
    """State made of plain Python values, given as keyword arguments and read
    and written as attributes.

    Args:
        bcast_object: how to broadcast a Python object from rank 0 (default:
            ``hvd.broadcast_object``).
        get_rank: this process's rank (default: ``hvd.rank``).
        **kwargs: the values, e.g. ``epoch=0, batch=0``.

    Example:
        >>> state = hvd.elastic.ObjectState(epoch=0)
        >>> state.epoch += 1
        >>> state.commit()
    """

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object or functions.broadcast_object, get_rank or basics.rank,
                         **kwargs)


class TensorFlowState(ObjectState):
    """State of TensorFlow variables plus plain values.

    Args:
        variables: the tf.Variables to keep in step (default: every global
            variable, in TF1 graph mode only; pass them in eager mode).
        **kwargs: plain values, as in :class:`ObjectState`.

    Example:
        >>> state = hvd.elastic.TensorFlowState([w, b], step=0)
    """

    def __init__(self, variables=None, **kwargs):
        if variables is None:
            variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        self._saved_values = None
        super().__init__(**kwargs)
        self._save_variables()

    def _save_variables(self):
        self._saved_values = [v.numpy().copy() for v in self.variables]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for var, value in zip(self.variables, self._saved_values):
            var.assign(value)
        super().restore()

    def sync(self):
        _broadcast(self.variables)
        self._save_variables()
        super().sync()


class TensorFlowKerasState(ObjectState):
    """State of a Keras model and its optimizer (its slots included, so a new
    worker has everything before its first step), plus plain values.

    Args:
        model: a built Keras model.
        optimizer: its optimizer (default: ``model.optimizer``).
        **kwargs: plain values, as in :class:`ObjectState`.

    Raises:
        ValueError: the model has no weights yet (build it first).

    Example:
        >>> state = hvd.elastic.TensorFlowKerasState(model, opt, epoch=0, batch=0)
    """

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if not model.weights:
            raise ValueError("TensorFlowKerasState needs a built model (give it an Input "
                             "or call it once): it has no weights to keep yet.")
        self._saved_values = None
        super().__init__(**kwargs)
        self._save_variables()

    def _variables(self):
        variables = list(self.model.variables)
        opt = self.optimizer
        if opt is not None:
            inner = getattr(opt, "_optimizer", opt)
            # Keras 3 and tf_keras optimizers make their slots on build (tf_keras
            # records it as _built); a worker that has not stepped yet builds
            # them now so that the broadcast fills them. A legacy OptimizerV2
            # makes slots only on its first step: build it before the state.
            built = getattr(inner, "built", None)
            if built is None:
                built = getattr(inner, "_built", False)
            if not built and hasattr(inner, "build"):
                inner.build(self.model.trainable_variables)
            # A property, or a method in tf_keras's legacy optimizers.
            mine = opt.variables() if callable(opt.variables) else opt.variables
            variables += [v for v in mine if all(v is not m for m in variables)]
        return variables

    def _save_variables(self):
        self._saved_values = [v.numpy().copy() for v in self._variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for var, value in zip(self._variables(), self._saved_values):
            var.assign(value)
        super().restore()

    def sync(self):
        _broadcast(self._variables())
        # PowerSGD's error feedback is each rank's own residual: one rank's
        # broadcast everywhere would count it several times in the average.
        compression = (getattr(self.optimizer, "_tfring_settings", None) or {}).get(
            "compression")
        if hasattr(compression, "forget_errors") and basics.rank() != 0:
            compression.forget_errors()
        self._save_variables()
        super().sync()

    def on_reset(self):
        # Keras caches its traced train/test/predict functions; traced code
        # may hold the old size or rank, so they are traced again.
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(self.model, name, None) is not None:
                setattr(self.model, name, None)
        super().on_reset()
