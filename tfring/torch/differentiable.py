"""The blocking collectives of tfring.torch, differentiable as in Horovod:
each is a torch.autograd.Function whose backward pass is the collective
that carries the gradient back.

======================  =================================================
forward                 backward (the gradient of the sum of every
                        rank's loss)
======================  =================================================
allreduce(op)           allreduce of the gradient with the same op and
                        scale factors
allgather               average over the ranks, then this rank's rows
broadcast               average over the ranks on the root, zero elsewhere
alltoall(splits)        alltoall back with the received splits
reducescatter(op)       allgather (times the set's size for Sum, as
                        Horovod), times the scale factors
======================  =================================================
"""
import torch

from tfring.torch import mpi_ops
from tfring.common.compression import check_compression
from tfring.torch.compression import Compression, predivide
from tfring.torch.mpi_ops import Average, Sum, global_process_set, synchronize


def _set(process_set):
    return global_process_set if process_set is None else process_set


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, prescale, postscale, name, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return synchronize(mpi_ops.allreduce_async(tensor, None, name, op, prescale, postscale,
                                                   process_set))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (synchronize(mpi_ops.allreduce_async(grad.contiguous(), None, None, op, prescale,
                                                    postscale, process_set)),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Reduces ``tensor`` over the ranks of the set (differentiable).

    Args:
        tensor: a torch tensor (CPU or CUDA), the same shape and dtype on
            every rank.
        average: deprecated: True is op=Average, False op=Sum.
        name: the collective's name, the same on every rank (default: one
            numbered in call order).
        compression: Compression.none, fp16 or bf16 (floating-point
            tensors travel in 16 bits, divided by the set's size first
            with op=Average; see tfring.torch.compression).
        op: Average (default), Sum, Min, Max, Product or Adasum.
        prescale_factor, postscale_factor: multiply the input before and
            the result after the reduction.
        process_set: a ProcessSet (default: every rank).

    Returns:
        A new tensor with the result, of ``tensor``'s dtype and device.

    Raises:
        HorovodInternalError: the ranks disagree (PreconditionError) or a
            rank failed. ValueError: before init(); bad arguments.
            TypeError: an unsupported dtype.

    Example:
        >>> import torch, tfring.torch as hvd
        >>> hvd.init()
        >>> hvd.allreduce(torch.ones(3), op=hvd.Sum)   # == size() everywhere
    """
    op = mpi_ops._reduce_op(average, op)
    compression = check_compression(compression, "allreduce")
    (tensor,), op, prescale_factor = predivide([tensor], compression, op, prescale_factor,
                                               process_set)
    sent, ctx = compression.compress(tensor)
    out = _Allreduce.apply(sent, op, prescale_factor, postscale_factor, name, process_set)
    return compression.decompress(out, ctx)


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, prescale, postscale, name, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(synchronize(mpi_ops.grouped_allreduce_async(
            tensors, None, name, op, prescale, postscale, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = synchronize(mpi_ops.grouped_allreduce_async(
            [g.contiguous() for g in grads], None, None, op, prescale, postscale, process_set))
        return (None,) * 5 + tuple(reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set):
    """Allreduces a list of tensors as one group (differentiable); arguments
    as :func:`allreduce`. Returns a list of new tensors.

    Example:
        >>> a, b = hvd.grouped_allreduce([torch.ones(2), torch.zeros(3)], op=hvd.Sum)
    """
    op = mpi_ops._reduce_op(average, op)
    compression = check_compression(compression, "grouped_allreduce")
    tensors, op, prescale_factor = predivide(list(tensors), compression, op, prescale_factor,
                                             process_set)
    compressed = [compression.compress(t) for t in tensors]
    out = _GroupedAllreduce.apply(op, prescale_factor, postscale_factor, name, process_set,
                                  *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(out, compressed)]


def _my_rows(grad, rows, process_set):
    """This rank's slice of a gathered gradient: rows[i] rows came from the
    set's i-th rank."""
    start = sum(rows[:process_set.rank()])
    return grad.narrow(0, start, rows[process_set.rank()])


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.process_set = _set(process_set)
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        return tuple(synchronize(mpi_ops.grouped_allgather_async(tensors, name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        ps = ctx.process_set
        reduced = synchronize(mpi_ops.grouped_allreduce_async(
            [g.contiguous() for g in grads], op=Average, process_set=ps))
        rows = synchronize(mpi_ops.allgather_async(
            torch.tensor([ctx.rows], dtype=torch.int64), process_set=ps)).tolist()
        return (None, None) + tuple(_my_rows(g, [r[i] for r in rows], ps)
                                    for i, g in enumerate(reduced))


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's ``tensor`` along the first dimension, in
    rank order (differentiable). The first dimension may differ by rank.

    Args:
        tensor: a torch tensor with at least one dimension.
        name, process_set: as :func:`allreduce`.

    Returns:
        A new tensor: the ranks' tensors stacked.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> hvd.allgather(torch.full((hvd.rank() + 1, 2), hvd.rank()))
    """
    return _Allgather.apply(name, process_set, tensor)[0]


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one group (differentiable); returns a
    list. Arguments as :func:`allgather`.

    Example:
        >>> rows, ids = hvd.grouped_allgather([x, labels])
    """
    return list(_Allgather.apply(name, process_set, *tensors))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.args = (root_rank, process_set)
        return synchronize(mpi_ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        root_rank, process_set = ctx.args
        reduced = synchronize(mpi_ops.allreduce_async(grad.contiguous(), op=Average,
                                                      process_set=process_set))
        if mpi_ops._core.rank() != root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Every rank gets rank ``root_rank``'s ``tensor`` (differentiable).

    Args:
        tensor: a torch tensor of the same shape and dtype on every rank.
        root_rank: the job-wide rank whose value is sent.
        name, process_set: as :func:`allreduce`.

    Returns:
        A new tensor holding the root's value.

    Raises:
        HorovodInternalError: ranks disagree on the root or shape, or the
            root is not in the set; and the errors of :func:`allreduce`.

    Example:
        >>> w = hvd.broadcast(w, root_rank=0)
    """
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        out, received = synchronize(mpi_ops.alltoall_async(tensor, splits, name, process_set))
        ctx.args = (received, process_set)
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad, _):
        received, process_set = ctx.args
        back, _ = synchronize(mpi_ops.alltoall_async(grad.contiguous(), received,
                                                     process_set=process_set))
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends rows of ``tensor`` to every rank of the set and receives theirs
    (differentiable).

    Args:
        tensor: a torch tensor with at least one dimension.
        splits: rows for each rank (a list or an int tensor summing to the
            first dimension); None splits it evenly.
        name, process_set: as :func:`allreduce`.

    Returns:
        Without ``splits``: the received tensor (the ranks' rows in rank
        order). With ``splits``: (received tensor, received_splits), the
        latter an int32 tensor of the rows received from each rank.

    Raises:
        ValueError: bad splits; and the errors of :func:`allreduce`.

    Example:
        >>> out, received = hvd.alltoall(torch.arange(4), splits=[1, 3])   # np=2
    """
    out, received = _Alltoall.apply(tensor, mpi_ops._splits_list(splits), name, process_set)
    return out if splits is None else (out, received)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, prescale, postscale, name, process_set, *tensors):
        ctx.args = (op, prescale * postscale, _set(process_set))
        return tuple(synchronize(mpi_ops.grouped_reducescatter_async(
            tensors, name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx, *grads):
        # Horovod's gradient: the gathered gradient, times the set's size
        # for Sum (once for Average), times the scale factors.
        op, scale, ps = ctx.args
        if op == Sum:
            scale *= ps.size()
        elif op != Average:
            raise NotImplementedError("tfring: reducescatter's gradient exists for Sum and "
                                      "Average only")
        gathered = synchronize(mpi_ops.grouped_allgather_async(
            [g.contiguous() for g in grads], process_set=ps))
        return (None,) * 5 + tuple(g * scale for g in gathered)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over the ranks; each gets its slice of the first
    dimension (rank r of n gets rows [r*k/n, (r+1)*k/n), the first ranks one
    more where it does not divide evenly). Differentiable.

    Args:
        tensor: a torch tensor with at least one dimension, the same shape
            on every rank.
        name, compression, process_set, prescale_factor, postscale_factor:
            as :func:`allreduce`.
        op: Average (default) or Sum (Min, Max, Product: not differentiable).

    Returns:
        A new tensor: this rank's slice of the result.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> part = hvd.reducescatter(torch.ones(hvd.size() * 2, 3), op=hvd.Sum)
    """
    return grouped_reducescatter([tensor], name, compression, op, process_set,
                                 prescale_factor, postscale_factor)[0]


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors as one group (differentiable);
    returns a list. Arguments as :func:`reducescatter`.

    Example:
        >>> a, b = hvd.grouped_reducescatter([torch.ones(4, 2), torch.ones(6)], op=hvd.Sum)
    """
    compression = check_compression(compression, "reducescatter")
    tensors, op, prescale_factor = predivide(list(tensors), compression, op, prescale_factor,
                                             process_set)
    compressed = [compression.compress(t) for t in tensors]
    out = _Reducescatter.apply(op, prescale_factor, postscale_factor, name, process_set,
                               *[c[0] for c in compressed])
    return [compression.decompress(o, c[1]) for o, c in zip(out, compressed)]
