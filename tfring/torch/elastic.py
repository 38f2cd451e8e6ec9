"""Elastic training for PyTorch: ``hvd.elastic.run``, ``TorchState`` and
``ElasticSampler``, with Horovod's names (``horovod.torch.elastic``), over
the worker machinery shared with TensorFlow (tfring.common.elastic; see
docs/elastic.md).

Example::

    import tfring.torch as hvd
    hvd.init()
    sampler = hvd.elastic.ElasticSampler(dataset)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for i, (x, y) in enumerate(loader_over(state.sampler)):
                step(x, y)
                state.sampler.record_batch(i, batch_size)
                state.commit()
            state.sampler.set_epoch(state.epoch + 1)

    train(state)
"""
import copy
import math
import random

import torch

import tfring.core as _core
from tfring.common import elastic as _elastic
from tfring.common.elastic import State
from tfring.common.exceptions import failure_of
from tfring.torch import functions
from tfring.torch.errors import HorovodInternalError, HostsUpdatedInterrupt
from tfring.torch.mpi_ops import Max, allreduce_

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HorovodInternalError", "HostsUpdatedInterrupt"]


def _is_internal_error(exc):
    """A lost peer: the failure's cause says the job ended."""
    failure = failure_of(exc)
    return failure is not None and failure[0].ends_job


def _reset():
    _core.shutdown()
    _core.init()


def run(func):
    """Decorates a training function so that it survives lost workers and
    takes in new ones: the state is synced from rank 0 first; when a peer
    is lost every survivor restores the last commit, re-forms the job,
    syncs and calls ``func`` again; new hosts are taken in at the next
    ``state.commit()``. Outside an elastic job ``func`` runs once.

    Args:
        func: called as ``func(state, *args, **kwargs)``.

    Returns:
        The wrapped function.

    Raises:
        Whatever ``func`` raises that is not a lost peer or a host update.

    Example:
        >>> @hvd.elastic.run
        ... def train(state):
        ...     ...
    """
    return _elastic.run_fn(func, _reset, _is_internal_error)


class _TorchStateBase(State):
    def _max_across_ranks(self, value):
        t = torch.tensor([int(value)], dtype=torch.int64)
        return int(allreduce_(t, op=Max, name="tfring_elastic_round")[0])


class ObjectState(_TorchStateBase, _elastic.ObjectState):
    """State made of plain Python values, read and written as attributes.

    Args:
        bcast_object: how to broadcast an object from rank 0 (default:
            ``hvd.broadcast_object``).
        get_rank: this process's rank (default: ``hvd.rank``).
        **kwargs: the values, e.g. ``epoch=0, batch=0``.

    Example:
        >>> state = hvd.elastic.ObjectState(epoch=0)
    """

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        super().__init__(bcast_object or functions.broadcast_object, get_rank or _core.rank,
                         **kwargs)


class TorchState(ObjectState):
    """State of a torch model and optimizer, plus plain values; an
    ElasticSampler among the values is saved, restored and synced with it.

    Args:
        model: a torch.nn.Module (optional).
        optimizer: a torch.optim.Optimizer (optional).
        **kwargs: plain values (and samplers), as in :class:`ObjectState`.

    Example:
        >>> state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        plain = {k: v for k, v in kwargs.items() if k not in self._samplers}
        super().__init__(**plain)
        self._save_objects()

    def _save_objects(self):
        self._saved_model = (copy.deepcopy(self.model.state_dict())
                             if self.model is not None else None)
        self._saved_optimizer = (copy.deepcopy(self.optimizer.state_dict())
                                 if self.optimizer is not None else None)
        self._saved_samplers = {k: s.state_dict() for k, s in self._samplers.items()}

    def save(self):
        self._save_objects()
        super().save()

    def restore(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for k, s in self._samplers.items():
            s.load_state_dict(self._saved_samplers[k])
        super().restore()

    def sync(self):
        if self.model is not None:
            functions.broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            functions.broadcast_optimizer_state(self.optimizer, root_rank=0)
        for k, s in self._samplers.items():
            s.load_state_dict(functions.broadcast_object(s.state_dict(), 0,
                                                         name=f"tfring.sampler.{k}"))
        self._save_objects()
        super().sync()


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset over the current ranks and counts the samples of the
    epoch already processed, so that after the job re-forms the rest are
    shared among the new ranks (none repeated, none skipped).

    Rank r of n takes every n-th sample of the epoch's remaining order from
    the r-th on, so after k batches of b on every rank exactly the first
    k*b*n remaining samples are done: one count, the same on every rank,
    says what is left.

    Args:
        dataset: anything with ``len()``.
        shuffle: shuffle the order each epoch (the same on every rank).
        seed: the shuffle's seed (plus the epoch).

    Example:
        >>> sampler = hvd.elastic.ElasticSampler(dataset)
        >>> loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
        >>> for i, batch in enumerate(loader):
        ...     train_step(batch)
        ...     sampler.record_batch(i, 32)
        ...     state.commit()
    """

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch ``epoch``: nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Marks batches 0..``batch_idx`` of this sharding (of ``batch_size``
        samples on every rank) as processed."""
        done = self._base + batch_size * self._size * (batch_idx + 1)
        self.processed_num = min(done, len(self.dataset))

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]
        self.processed_num = state["processed_num"]
        self.reset()

    def reset(self):
        """Re-shards the epoch's unprocessed samples over the current ranks."""
        rank = _core.rank() if _core.is_initialized() else 0
        self._size = _core.size() if _core.is_initialized() else 1
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        remaining = order[self.processed_num:]
        self._base = self.processed_num
        self.num_samples = int(math.ceil(len(remaining) / self._size)) if remaining else 0
        padded = remaining + remaining[:self.num_samples * self._size - len(remaining)]
        self.indices = padded[rank::self._size]

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
