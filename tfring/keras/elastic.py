"""Elastic training with Keras ``model.fit``, with Horovod's names
(``horovod.tensorflow.keras.elastic``). See docs/elastic.md.

Example::

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.CommitStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state)]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, steps_per_epoch=steps, epochs=epochs,
                  initial_epoch=state.epoch, callbacks=callbacks)

    train(state)
"""
import tensorflow as tf

from tfring.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from tfring.tensorflow.elastic import ObjectState, TensorFlowKerasState, run

__all__ = ["run", "KerasState", "ObjectState", "CommitStateCallback",
           "UpdateBatchStateCallback", "UpdateEpochStateCallback", "HorovodInternalError",
           "HostsUpdatedInterrupt"]


class KerasState(TensorFlowKerasState):
    """State of a Keras model, its optimizer and plain values (``epoch``,
    ``batch``...).

    Args:
        model: a built Keras model, compiled or not.
        optimizer: its optimizer (default: ``model.optimizer``).
        **kwargs: plain values, kept in step and rolled back with the model.

    Example:
        >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    """

    def __init__(self, model, optimizer=None, **kwargs):
        super().__init__(model, optimizer, **kwargs)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits the state every `batches_per_commit` batches and at the end of
    each epoch, so that a failure loses at most that many batches. A commit
    also checks for new hosts (and may end ``fit`` with
    HostsUpdatedInterrupt, which ``elastic.run`` handles).

    Args:
        state: the :class:`KerasState`.
        batches_per_commit: batches between commits (1: after every batch).

    Raises:
        ValueError: batches_per_commit is not a positive integer.

    Example:
        >>> CommitStateCallback(state, batches_per_commit=10)
    """

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be a positive integer, got "
                             f"{batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None):
        self.state.commit()
        self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.batch`` at the number of batches done in the current
    epoch (0 at an epoch's end). Put it before :class:`CommitStateCallback`.

    Keras 3 cannot start ``fit`` in the middle of an epoch, so to resume at
    ``state.batch > 0`` the training function first finishes that epoch
    with a ``fit`` of ``steps - state.batch`` steps on the data that epoch
    has not seen (docs/elastic.md shows it); the batches done before it
    started are counted here, so ``state.batch`` stays the epoch's position.

    Args:
        state: a state with a ``batch`` attribute.

    Example:
        >>> UpdateBatchStateCallback(state)
    """

    def __init__(self, state):
        super().__init__()
        self.state = state
        self._offset = 0

    def on_epoch_begin(self, epoch, logs=None):
        # Batches done before this fit() started count towards this epoch.
        self._offset = self.state.batch

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0
        self._offset = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the next epoch to run; pass
    ``initial_epoch=state.epoch`` to ``fit``. Put it before
    :class:`CommitStateCallback`.

    Args:
        state: a state with an ``epoch`` attribute.

    Example:
        >>> UpdateEpochStateCallback(state)
    """

    def __init__(self, state):
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1
