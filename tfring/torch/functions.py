"""Python objects and model state across ranks, for tfring.torch:
broadcast_object, allgather_object, broadcast_parameters and
broadcast_optimizer_state (Horovod's names and arguments)."""
import io

import cloudpickle
import torch

import tfring.core as _core
from tfring.torch import mpi_ops
from tfring.torch.mpi_ops import global_process_set, synchronize
from tfring.torch.optimizer import _DistributedOptimizer


def _to_bytes(obj):
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(tensor):
    return cloudpickle.loads(tensor.numpy().tobytes())


def _named(name, part):
    return None if name is None else f"{name}.{part}"


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Sends a picklable object from rank ``root_rank`` to every rank of the
    set (cloudpickle, so lambdas and local classes work).

    Args:
        obj: the object (only the root's is used).
        root_rank: the job-wide rank that sends.
        name: a name for the collectives (default: numbered in call order).
        process_set: a ProcessSet (default: every rank).

    Returns:
        The root's object, on every rank.

    Raises:
        The errors of tfring.torch.broadcast.

    Example:
        >>> config = hvd.broadcast_object(config if hvd.rank() == 0 else None)
    """
    payload = _to_bytes(obj) if _core.rank() == root_rank else torch.empty(0, dtype=torch.uint8)
    length = torch.tensor([payload.numel()], dtype=torch.int64)
    length = synchronize(mpi_ops.broadcast_async(length, root_rank, _named(name, "size"),
                                                 process_set))
    if _core.rank() != root_rank:
        payload = torch.empty(int(length[0]), dtype=torch.uint8)
    payload = synchronize(mpi_ops.broadcast_async(payload, root_rank, _named(name, "data"),
                                                  process_set))
    return _from_bytes(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Gathers a picklable object from every rank of the set.

    Args:
        obj: this rank's object.
        name, process_set: as :func:`broadcast_object`.

    Returns:
        A list of every rank's object, in rank order.

    Example:
        >>> counts = hvd.allgather_object(len(my_shard))
    """
    payload = _to_bytes(obj)
    lengths = synchronize(mpi_ops.allgather_async(
        torch.tensor([payload.numel()], dtype=torch.int64), _named(name, "sizes"), process_set))
    data = synchronize(mpi_ops.allgather_async(payload, _named(name, "data"), process_set))
    out, start = [], 0
    for n in lengths.tolist():
        out.append(_from_bytes(data[start:start + n]))
        start += n
    return out


def broadcast_parameters(params, root_rank, prefix=None):
    """Overwrites every rank's parameters with rank ``root_rank``'s, in place.

    Args:
        params: ``model.state_dict()``, ``model.named_parameters()`` or a
            list of (name, tensor) pairs; the same names on every rank.
        root_rank: the rank whose values are kept.
        prefix: prepended to each name (to tell several calls apart).

    Raises:
        ValueError: ``params`` is not a dict or (name, tensor) pairs. And the
            errors of tfring.torch.broadcast.

    Example:
        >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = list(params)
        if any(not (isinstance(p, tuple) and len(p) == 2) for p in items):
            raise ValueError("broadcast_parameters takes a state_dict or (name, tensor) pairs")
    else:
        raise ValueError(f"broadcast_parameters: params of type {type(params).__name__}")
    handles = [mpi_ops.broadcast_async_(p, root_rank, f"{prefix or ''}bcast.{n}")
               for n, p in items if isinstance(p, torch.Tensor)]
    for h in handles:
        synchronize(h)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _initialize_state(optimizer):
    """Gives an optimizer that has taken no step its state, as Horovod does:
    a zero gradient for each trainable parameter without one (those not
    trainable keep none), then one step of the wrapped optimizer itself (a
    DistributedOptimizer's own step() would ask every rank to reduce)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    if isinstance(optimizer, _DistributedOptimizer):
        super(_DistributedOptimizer, optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Gives every rank rank ``root_rank``'s optimizer state (moments, step
    counts) and hyperparameters (param_groups: lr, momentum, ...). An
    optimizer that has taken no step is first given its state as Horovod
    does: trainable parameters without a gradient get a zero one, and the
    wrapped optimizer takes one step with them (parameters without
    requires_grad keep grad None).

    Args:
        optimizer: a torch.optim.Optimizer (or a DistributedOptimizer) over
            the same parameters, in the same order, on every rank.
        root_rank: the rank whose state is kept.
        model: accepted for Horovod compatibility (unused).

    Raises:
        The errors of :func:`broadcast_object`.

    Example:
        >>> hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    """
    if not optimizer.state:
        _initialize_state(optimizer)
    state = _to_cpu(optimizer.state_dict()) if _core.rank() == root_rank else None
    state = broadcast_object(state, root_rank, name="tfring.optimizer_state")
    if _core.rank() != root_rank:
        optimizer.load_state_dict(state)
