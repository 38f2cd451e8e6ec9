"""The collectives of tfring.torch that return handles, with Horovod's torch
names and arguments: ``*_async`` (a new output tensor) and ``*_async_``
(the result written into the input), plus ``poll`` and ``synchronize``.

A handle is an int, as in Horovod. The work is tfring.core's: it takes
torch tensors (CPU or CUDA) and returns torch tensors; this module only
keeps the handles, writes in-place results and names Horovod's errors
(tfring.torch.errors). The differentiable blocking functions are in
tfring.torch.differentiable.
"""
import itertools
import threading
import warnings

import torch

import tfring.core as _core
from tfring.core import ops as _ops
from tfring.torch import errors

Average, Sum, Adasum, Min, Max, Product = (_core.Average, _core.Sum, _core.Adasum, _core.Min,
                                           _core.Max, _core.Product)
global_process_set = _core.global_process_set

_lock = threading.Lock()
_handles = {}
_ids = itertools.count(1)


def _register(core_handle, finish=None):
    """Keeps a core handle (and what turns its result into ours) under a new
    int handle."""
    with _lock:
        handle = next(_ids)
        _handles[handle] = (core_handle, finish)
    return handle


def _entry(handle):
    if isinstance(handle, SparseHandle):
        handle = handle.handle
    with _lock:
        entry = _handles.get(handle)
    if entry is None:
        raise ValueError(f"tfring: handle {handle!r} is not a pending collective (already "
                         "synchronized, or never returned by an *_async call)")
    return entry


def poll(handle):
    """True once the collective of ``handle`` has finished (its result or
    error is ready; synchronize() then returns at once).

    Args:
        handle: an int returned by an ``*_async`` function.

    Raises:
        ValueError: an unknown or already synchronized handle.

    Example:
        >>> h = hvd.allreduce_async(x)
        >>> while not hvd.poll(h):
        ...     pass
        >>> y = hvd.synchronize(h)
    """
    return _entry(handle)[0].poll()


def synchronize(handle):
    """Waits for the collective of ``handle`` and returns its result.

    On CUDA tensors this completes by event, as ``torch.distributed``'s
    ``work.wait()`` does: it returns once the collective is queued on the
    GPU, with the current stream made to wait for it there (the host does
    not wait; ``.cpu()`` and the kernels queued next read the result).

    Args:
        handle: an int returned by an ``*_async`` function.

    Returns:
        The output tensor (the input tensor for in-place ``*_async_`` calls,
        a list for grouped calls, (output, received_splits) for
        alltoall_async).

    Raises:
        HorovodInternalError: the collective failed: the ranks disagree
            (tfring.torch.PreconditionError) or a rank failed or left
            (the message names it).
        ValueError: an unknown handle.

    Example:
        >>> y = hvd.synchronize(hvd.allreduce_async(x))
    """
    if isinstance(handle, SparseHandle):
        handle = handle.handle
    core_handle, finish = _entry(handle)
    try:
        result = core_handle.wait()
    except _core.CoreError as e:
        raise errors.translate(e) from None
    finally:
        with _lock:
            _handles.pop(handle, None)
    return finish(result) if finish else result


def _reduce_op(average, op):
    """Horovod's op argument: ``average`` (deprecated) or ``op``, Average by
    default."""
    if average is not None:
        if op is not None:
            raise ValueError("tfring: give op or the deprecated average, not both")
        warnings.warn("average= is deprecated: use op=hvd.Average or op=hvd.Sum",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average if op is None else op


def _into(targets):
    """A finish function that puts results into ``targets`` (a tensor or a
    list) and returns them: in-place calls leave the result in the target
    itself, and only one that went through a contiguous copy (or an
    out-of-place call) is copied back."""
    def finish(result):
        with torch.no_grad():
            if isinstance(targets, (list, tuple)):
                for t, r in zip(targets, result):
                    if r is not t:
                        t.copy_(r)
            elif result is not targets:
                targets.copy_(result)
        return targets
    return finish


# The core's collective code of each submitting function, and whether it
# groups its tensors (for abandon()).
_CODES = {_core.allreduce_async: (_ops._ALLREDUCE, False),
          _core.allreduce_async_: (_ops._ALLREDUCE, False),
          _core.grouped_allreduce_async: (_ops._ALLREDUCE, True),
          _core.grouped_allreduce_async_: (_ops._ALLREDUCE, True),
          _core.allgather_async: (_ops._ALLGATHER, False),
          _core.grouped_allgather_async: (_ops._ALLGATHER, True),
          _core.broadcast_async: (_ops._BROADCAST, False),
          _core.broadcast_async_: (_ops._BROADCAST, False),
          _core.alltoall_async: (_ops._ALLTOALL, False),
          _core.reducescatter_async: (_ops._REDUCESCATTER, False),
          _core.grouped_reducescatter_async: (_ops._REDUCESCATTER, True)}


def _submit(fn, tensors, *args, name=None, process_set=global_process_set, **kwargs):
    """Calls the core's ``fn``; a non-tensor raises TypeError here, and the
    other ranks are told (tfring.core.ops.abandon) rather than left waiting."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            error = TypeError(f"tfring.torch.{fn.__name__} takes torch tensors, not "
                              f"{type(t).__name__}")
            code, grouped = _CODES[fn]
            _ops.abandon(code, name, process_set, len(tensors), error, grouped)
            raise error
    try:
        return fn(*args, name=name, process_set=process_set, **kwargs)
    except _core.CoreError as e:
        raise errors.translate(e) from None


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of ``tensor``; its result is a new tensor.

    Args:
        tensor: a torch tensor (CPU or CUDA) of the same shape and dtype on
            every rank of the set.
        average: deprecated: True is op=Average, False op=Sum.
        name: the collective's name, the same on every rank (default: one
            numbered in call order).
        op: Average (default), Sum, Min, Max, Product or Adasum.
        prescale_factor: multiplies the input before the reduction.
        postscale_factor: multiplies the result.
        process_set: a ProcessSet (default: every rank).

    Returns:
        An int handle for poll() and synchronize().

    Raises:
        ValueError: before init(); bad arguments. TypeError: a dtype the
            core does not have.

    Example:
        >>> h = hvd.allreduce_async(torch.ones(3), op=hvd.Sum)
        >>> hvd.synchronize(h)
    """
    return _register(_submit(_core.allreduce_async, [tensor], tensor, _reduce_op(average, op),
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set))


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """allreduce_async() that writes the result into ``tensor``; synchronize()
    returns ``tensor``. Arguments as :func:`allreduce_async`."""
    return _register(_submit(_core.allreduce_async_, [tensor], tensor, _reduce_op(average, op),
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set),
                     _into(tensor))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """Allreduces ``tensor`` in place and returns it (not differentiable).
    Arguments and errors as :func:`allreduce_async`.

    Example:
        >>> hvd.allreduce_(grad, op=hvd.Average)
    """
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts an allreduce of a list of tensors as one group (reduced
    together once every rank has submitted all of them). synchronize()
    returns a list of new tensors. Arguments as :func:`allreduce_async`.

    Example:
        >>> a, b = hvd.synchronize(hvd.grouped_allreduce_async([x, y]))
    """
    tensors = list(tensors)
    return _register(_submit(_core.grouped_allreduce_async, tensors, tensors,
                             _reduce_op(average, op), prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set))


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """grouped_allreduce_async() that writes each result into its input."""
    tensors = list(tensors)
    return _register(_submit(_core.grouped_allreduce_async_, tensors, tensors,
                             _reduce_op(average, op), prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set), _into(tensors))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors in place, as one group; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class SparseHandle:
    """What :func:`sparse_allreduce_async` returns, as in Horovod a function:
    calling it waits and returns the sparse result. poll() and synchronize()
    take it too.

    Example:
        >>> handle = hvd.sparse_allreduce_async(grad, name="emb", op=hvd.Average)
        >>> reduced = handle()
    """

    def __init__(self, handle):
        self.handle = handle

    def __call__(self):
        return synchronize(self.handle)


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts the reduction of a sparse COO tensor as Horovod does it: every
    rank's indices and values are gathered (one grouped allgather), and the
    result is the sparse tensor of all of them, uncoalesced: entries at the
    same index add up when it is used or coalesced; values are divided by
    the set's size for Average.

    Args:
        tensor: a sparse COO tensor of the same dense shape on every rank.
        name: the collective's name, the same on every rank (default: one
            numbered in call order).
        op: Average (default) or Sum.
        process_set: a ProcessSet (default: every rank).

    Returns:
        A :class:`SparseHandle`: call it (Horovod's way) or pass it to
        synchronize() for the sparse result.

    Raises:
        ValueError: another op. TypeError: a dense tensor.

    Example:
        >>> dense = hvd.sparse_allreduce_async(grad, "emb", hvd.Sum)().to_dense()
    """
    if op not in (Average, Sum):
        raise ValueError("sparse_allreduce_async takes op=Average or op=Sum")
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise TypeError("sparse_allreduce_async takes a sparse COO torch tensor, not "
                        f"{type(tensor).__name__ if not isinstance(tensor, torch.Tensor) else 'a dense one'}")
    ps = global_process_set if process_set is None else process_set
    shape = tensor.shape

    def finish(result):
        indices, values = result
        if op == Average:
            values = values / ps.size()
        return torch.sparse_coo_tensor(indices.t(), values, shape)
    # Uncoalesced on purpose, as Horovod: coalescing here would sort and sum
    # on every rank a result that the optimizer may use as it is.
    return SparseHandle(_register(_submit(
        _core.grouped_allgather_async, [tensor], [tensor._indices().t().contiguous(),
                                                  tensor._values().contiguous()],
        name=name, process_set=process_set), finish))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: every rank's ``tensor`` concatenated along the
    first dimension, in rank order (the first dimension may differ by rank).

    Example:
        >>> rows = hvd.synchronize(hvd.allgather_async(torch.ones(hvd.rank() + 1, 2)))
    """
    return _register(_submit(_core.allgather_async, [tensor], tensor, name=name,
                             process_set=process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of a list of tensors as one group; synchronize()
    returns a list."""
    tensors = list(tensors)
    return _register(_submit(_core.grouped_allgather_async, tensors, tensors, name=name,
                             process_set=process_set))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of rank ``root_rank``'s ``tensor`` (a job-wide
    rank); synchronize() returns a new tensor.

    Example:
        >>> w = hvd.synchronize(hvd.broadcast_async(w, root_rank=0))
    """
    return _register(_submit(_core.broadcast_async, [tensor], tensor, root_rank, name=name,
                             process_set=process_set))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast_async() that writes the root's value into ``tensor``."""
    return _register(_submit(_core.broadcast_async_, [tensor], tensor, root_rank, name=name,
                             process_set=process_set), _into(tensor))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Broadcasts into ``tensor`` in place and returns it (not differentiable).

    Example:
        >>> hvd.broadcast_(param.data, root_rank=0)
    """
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _splits_list(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize() returns (output, received_splits),
    the latter an int32 tensor of the rows received from each rank.

    Args:
        tensor: rows to send: the first ``splits[0]`` to the set's first
            rank, and so on.
        splits: a list or int tensor of rows per rank (default: even).
        name, process_set: as :func:`allreduce_async`.

    Example:
        >>> out, received = hvd.synchronize(hvd.alltoall_async(x, splits=[1, 3]))
    """
    splits = _splits_list(splits)
    size = (global_process_set if process_set is None else process_set).size()
    if splits is None and isinstance(tensor, torch.Tensor) and tensor.dim() and size \
            and tensor.shape[0] % size == 0:
        # Even splits, spelled out: each rank's own rows per rank, which may
        # differ by rank, so the rows received come back from the core (the
        # gradient sends them back with those splits). A first dimension
        # that does not divide is left to the core's error.
        splits = [tensor.shape[0] // size] * size

    def finish(result):
        out, received = result
        return out, torch.from_numpy(received).to(torch.int32)
    return _register(_submit(_core.alltoall_async, [tensor], tensor, splits, name=name,
                             process_set=process_set),
                     finish)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter: the reduction over the ranks, of which each
    rank gets its slice of the first dimension (the first ranks one row
    more when it does not divide evenly).

    Example:
        >>> part = hvd.synchronize(hvd.reducescatter_async(torch.ones(4, 2), op=hvd.Sum))
    """
    return _register(_submit(_core.reducescatter_async, [tensor], tensor, op,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set))


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Starts a reducescatter of a list of tensors as one group."""
    tensors = list(tensors)
    return _register(_submit(_core.grouped_reducescatter_async, tensors, tensors, op,
                             prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name,
                             process_set=process_set))


def join(device=-1):
    """Tells the other ranks this one has no more allreduces (they count it as
    zeros) and waits until every rank has joined.

    Args:
        device: accepted for Horovod compatibility (unused).

    Returns:
        The rank that joined last.

    Example:
        >>> last = hvd.join()
    """
    try:
        return int(_core.join())
    except _core.CoreError as e:
        raise errors.translate(e) from None


def barrier(process_set=global_process_set):
    """Waits until every rank of the set has called barrier().

    Example:
        >>> hvd.barrier()
    """
    try:
        _core.barrier(process_set)
    except _core.CoreError as e:
        raise errors.translate(e) from None
