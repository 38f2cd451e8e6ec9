"""The collectives of tfring.core: each submits raw buffers to the core
(``_tfring_core.enqueue``) and gives back arrays of the caller's kind.
A single C-contiguous numpy array, CuPy array or CUDA torch tensor takes
the short way instead (``_submit_array``: one ``submit_array`` or
``submit_device`` call, which reads the array and enqueues in C++), as most
steady-state calls do.

Every ``*_async`` function returns a :class:`Handle`; the blocking function
of the same name is ``*_async(...).wait()``. The collective's arguments are
checked by the core (on this rank, then across ranks during negotiation),
not here: this layer only describes arrays and makes outputs.
"""
import numpy as np

from tfring.core import _module, arrays, errors, names
from tfring.core.handles import Handle, _ArrayHandle
from tfring.core.lifecycle import _require_init
from tfring.core.process_sets import global_process_set as _GLOBAL_SET
from tfring.core.process_sets import process_set_id as _process_set_id

# Reduce ops, numbered as the core (and Horovod) number them.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
# Collective codes (tf_ops/common/common.h, CollectiveType).
_ALLREDUCE, _ALLGATHER, _BROADCAST, _ALLTOALL, _REDUCESCATTER = 0, 1, 2, 3, 4
_KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter"]

def _auto_name(kind, process_set):
    return names.auto_name(kind, _process_set_id(process_set))


_NOT_SEEN = object()
# Per array type: how the one-call GPU path takes it (arrays.one_call_gpu),
# or None; filled as types are first seen.
_GPU_KINDS = {}


def _submit_array(collective, x, name, process_set, op=Sum, prescale=1.0, postscale=1.0,
                  root_rank=0, in_place=False):
    """The steady-state path: one array submitted by one call into the core,
    which reads it, makes the output (numpy) or takes the one made here (GPU
    arrays) and enqueues there: ``submit_array`` for a numpy array,
    ``submit_device`` for a CuPy array or CUDA torch tensor (allreduce and
    broadcast). Returns (an :class:`_ArrayHandle`, name), or (None, name)
    when the call is not one it takes (another kind of array, a
    non-contiguous or unsupported one, a process set object, unusual
    argument types): the general path (:func:`_submit`) then handles it with
    the name returned, and names any problem. A default name is numbered
    once either way, so that every rank numbers alike whichever path its
    array takes."""
    core = _module._module
    kind = type(x)
    prepare = None
    if kind is not np.ndarray:
        prepare = _GPU_KINDS.get(kind, _NOT_SEEN)
        if prepare is _NOT_SEEN:
            prepare = _GPU_KINDS[kind] = arrays.one_call_gpu(kind)
        if prepare is None or (collective != _ALLREDUCE and collective != _BROADCAST):
            return None, name
    if process_set is _GLOBAL_SET:
        process_set = None  # tfring.torch passes it by default
    if (core is None or type(op) is not int
            or (process_set is not None and type(process_set) is not int)):
        return None, name
    if not name:
        name = _auto_name(_KINDS[collective], process_set)
        intern = False  # numbered defaults never come back
    elif type(name) is str:
        intern = True
    else:
        return None, name
    try:
        if prepare is None:
            call = core.submit_array(collective, x, name, intern, process_set or 0, op, prescale,
                                     postscale, root_rank, in_place)
        else:
            prepared = prepare(x, in_place)
            if prepared is None:
                return None, name
            call = core.submit_device(collective, x, prepared[1], prepared[0], name, intern,
                                      process_set or 0, op, prescale, postscale, root_rank)
    except TypeError:  # an argument pybind11 does not convert: the general path says why
        return None, name
    if call is None:
        return None, name
    if type(call) is tuple:
        _require_init()  # before init() or after shutdown(): its own error type
        errors.raise_for_status(*call)
    return _ArrayHandle(call, None if prepare is None else x), name


def _submit(collective, xs, name, process_set, grouped=False, op=Sum, prescale=1.0,
            postscale=1.0, root_rank=0, splits=None, in_place=False):
    """Enqueues ``xs`` (one call); returns (PendingCall, adapted inputs,
    outputs made now, outputs made on negotiation). ``name`` None: one
    numbered in call order."""
    core = _require_init()
    name = name or _auto_name(("grouped_" if grouped else "") + _KINDS[collective], process_set)
    try:
        adapted = [arrays.adapt(x) for x in xs]
        devices = {a.device for a in adapted}
        if len(devices) > 1:
            raise errors.InvalidArgumentError(
                f"tfring: the tensors of one call must be on one device, not on "
                f"{sorted(devices)}", errors.INVALID_ARGUMENT)
        device = adapted[0].device if adapted else arrays.CPU
        ready = None
        if device != arrays.CPU:
            code, message, cause, rank, ready = core.ready_event(device, adapted[0].stream)
            errors.raise_for_status(code, message, cause, rank)
    except Exception as e:
        abandon(collective, name, process_set, len(xs), e, grouped)
        raise
    # In place, the result goes into the memory the core reads (the input
    # itself when it was contiguous, else the contiguous copy made of it,
    # which the caller then copies back): no new array, and no pass of page
    # faults over freshly allocated memory.
    fixed_adapted = [(a if in_place else a.new_adapted(a.shape))
                     if collective in (_ALLREDUCE, _BROADCAST) else None for a in adapted]
    late = [None] * len(adapted)

    def allocate(index, shape):
        out = adapted[index].new_adapted(tuple(shape))
        late[index] = out
        return out.ptr

    specs = [core.TensorSpec(a.ptr, o.ptr if o is not None else 0, list(a.shape), a.code)
             for a, o in zip(adapted, fixed_adapted)]
    call = core.enqueue(
        collective, specs, name, process_set_id=_process_set_id(process_set), grouped=grouped,
        reduce_op=int(op), prescale=float(prescale), postscale=float(postscale),
        root_rank=int(root_rank), splits=[int(s) for s in (splits or [])], device=device,
        stream=adapted[0].stream if adapted else 0, ready_event=ready,
        allocator=None if collective in (_ALLREDUCE, _BROADCAST) else allocate,
        keep_alive=(adapted, fixed_adapted, late))
    # A call the core refused (a name already in flight here, bad splits)
    # raises now, on this rank, as Horovod's *_async calls do.
    errors.raise_for_status(*call.submit_status())
    return call, adapted, fixed_adapted, late


def abandon(collective, name, process_set, count, why, grouped=False):
    """Tells the other ranks of the set that this rank raised ``why``
    instead of submitting the call ``name`` (``count`` tensors of collective
    code ``collective``): they get an error naming this rank instead of
    waiting. Nothing is sent when a collective of that name is in flight
    here (a duplicate name raises on this rank alone).

    Example:
        >>> abandon(_ALLREDUCE, "grad.0", None, 1, TypeError("not a tensor"))
    """
    core = _require_init()
    name = name or _auto_name(("grouped_" if grouped else "") + _KINDS[collective], process_set)
    core.abandon(collective, name, _process_set_id(process_set), grouped, max(count, 1),
                 f"{type(why).__name__}: {why}")


def _outputs(adapted, made):
    return [a.wrap(m.array) for a, m in zip(adapted, made)]


def allreduce_async(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=None):
    """Starts an allreduce; see :func:`allreduce`. Returns a :class:`Handle`."""
    handle, name = _submit_array(_ALLREDUCE, tensor, name, process_set, op, prescale_factor,
                                 postscale_factor)
    if handle is not None:
        return handle
    call, adapted, fixed, _ = _submit(_ALLREDUCE, [tensor], name,
                                      process_set, op=op, prescale=prescale_factor,
                                      postscale=postscale_factor)
    return Handle(call, lambda c: _outputs(adapted, fixed)[0], adapted)


def allreduce_async_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=None):
    """Starts an allreduce whose result is written into the array the core
    reads; see :func:`allreduce_`. Returns a :class:`Handle`."""
    handle, name = _submit_array(_ALLREDUCE, tensor, name, process_set, op, prescale_factor,
                                 postscale_factor, in_place=True)
    if handle is not None:
        return handle
    call, adapted, _, _ = _submit(_ALLREDUCE, [tensor], name, process_set, op=op,
                                  prescale=prescale_factor, postscale=postscale_factor,
                                  in_place=True)
    return Handle(call, lambda c: adapted[0].wrap(adapted[0].array), adapted)


def allreduce_(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=None):
    """:func:`allreduce` in place: the result overwrites ``tensor``.

    Args:
        tensor: a C-contiguous array (another is copied first, and the copy
            holds the result); other arguments as :func:`allreduce`.

    Returns:
        The array that holds the result: ``tensor`` itself when it was
        contiguous (numpy, CuPy and torch arrays are used as they are).

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> x = np.ones(3, np.float32)
        >>> hvd.allreduce_(x, op=hvd.Sum) is x
        True
    """
    return allreduce_async_(tensor, op, name, prescale_factor, postscale_factor,
                            process_set).wait()


def allreduce(tensor, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=None):
    """Reduces ``tensor`` over every rank of the process set.

    Args:
        tensor: an array (numpy, torch, CuPy or any ``__cuda_array_interface__``
            or DLPack object) of the same shape and dtype on every rank.
        op: Average (default), Sum, Min, Max, Product or Adasum.
        name: the collective's name, the same on every rank (default: one
            numbered in call order).
        prescale_factor: multiplies each rank's input before the reduction.
        postscale_factor: multiplies the result.
        process_set: a ProcessSet from add_process_set(), or its id;
            default (None or global_process_set): every rank.

    Returns:
        A new array of the caller's kind, dtype and device with the result.

    Raises:
        TypeError: a dtype the core does not have.
        InvalidArgumentError: bad input found on this rank (a ValueError).
        PreconditionError: the ranks disagree (shape, dtype, op, ...).
        NotInitializedError: before init() (a ValueError).
        AbortedError: a rank failed or shut down (a HorovodInternalError).

    Example:
        >>> import numpy as np, tfring.core as hvd
        >>> hvd.init()
        >>> hvd.allreduce(np.ones(3, np.float32), op=hvd.Sum)  # == size() everywhere
    """
    return allreduce_async(tensor, op, name, prescale_factor, postscale_factor,
                           process_set).wait()


def grouped_allreduce_async(tensors, op=Average, name=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=None):
    """Starts a grouped allreduce; see :func:`grouped_allreduce`."""
    tensors = list(tensors)
    call, adapted, fixed, _ = _submit(_ALLREDUCE, tensors,
                                      name, process_set,
                                      grouped=True, op=op, prescale=prescale_factor,
                                      postscale=postscale_factor)
    return Handle(call, lambda c: _outputs(adapted, fixed), adapted)


def grouped_allreduce_async_(tensors, op=Average, name=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=None):
    """:func:`grouped_allreduce_async` in place: each result overwrites its
    input (see :func:`allreduce_`); the handle gives the arrays holding them."""
    call, adapted, _, _ = _submit(_ALLREDUCE, list(tensors), name, process_set, grouped=True,
                                  op=op, prescale=prescale_factor, postscale=postscale_factor,
                                  in_place=True)
    return Handle(call, lambda c: [a.wrap(a.array) for a in adapted], adapted)


def grouped_allreduce(tensors, op=Average, name=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None):
    """Allreduces a list of arrays as one group: the core runs them together
    (fused) once every rank has submitted all of them.

    Args:
        tensors: a list of arrays, all on one device; the same list (shapes
            and dtypes) on every rank.
        op, name, prescale_factor, postscale_factor, process_set: as
            :func:`allreduce`.

    Returns:
        A list of new arrays, one per input, in order.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> a, b = hvd.grouped_allreduce([np.ones(2), np.zeros(3)], op=hvd.Sum)
    """
    return grouped_allreduce_async(tensors, op, name, prescale_factor, postscale_factor,
                                   process_set).wait()


def allgather_async(tensor, name=None, process_set=None):
    """Starts an allgather; see :func:`allgather`."""
    handle, name = _submit_array(_ALLGATHER, tensor, name, process_set)
    if handle is not None:
        return handle
    call, adapted, _, late = _submit(_ALLGATHER, [tensor], name,
                                     process_set)
    return Handle(call, lambda c: _outputs(adapted, late)[0], adapted)


def allgather(tensor, name=None, process_set=None):
    """Concatenates every rank's ``tensor`` along the first dimension, in
    rank order. The first dimension may differ between ranks; the others
    and the dtype may not.

    Args:
        tensor: an array with at least one dimension.
        name, process_set: as :func:`allreduce`.

    Returns:
        A new array of the caller's kind: the ranks' arrays stacked.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> hvd.allgather(np.full((hvd.rank() + 1, 2), hvd.rank()))  # 1 + 2 + ... rows
    """
    return allgather_async(tensor, name, process_set).wait()


def grouped_allgather_async(tensors, name=None, process_set=None):
    """Starts a grouped allgather; see :func:`grouped_allgather`."""
    call, adapted, _, late = _submit(_ALLGATHER, list(tensors), name, process_set, grouped=True)
    return Handle(call, lambda c: _outputs(adapted, late), adapted)


def grouped_allgather(tensors, name=None, process_set=None):
    """Allgathers a list of arrays as one group (dtypes may differ).

    Args:
        tensors: a list of arrays, all on one device.
        name, process_set: as :func:`allreduce`.

    Returns:
        A list of new arrays, one per input, in order.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> rows, ids = hvd.grouped_allgather([np.ones((2, 3)), np.arange(2)])
    """
    return grouped_allgather_async(tensors, name, process_set).wait()


def broadcast_async(tensor, root_rank, name=None, process_set=None):
    """Starts a broadcast; see :func:`broadcast`."""
    if type(root_rank) is int:
        handle, name = _submit_array(_BROADCAST, tensor, name, process_set, root_rank=root_rank)
        if handle is not None:
            return handle
    call, adapted, fixed, _ = _submit(_BROADCAST, [tensor], name,
                                      process_set, root_rank=root_rank)
    return Handle(call, lambda c: _outputs(adapted, fixed)[0], adapted)


def broadcast_async_(tensor, root_rank, name=None, process_set=None):
    """:func:`broadcast_async` in place: the root's value overwrites
    ``tensor`` (see :func:`allreduce_`)."""
    if type(root_rank) is int:
        handle, name = _submit_array(_BROADCAST, tensor, name, process_set,
                                     root_rank=root_rank, in_place=True)
        if handle is not None:
            return handle
    call, adapted, _, _ = _submit(_BROADCAST, [tensor], name, process_set, root_rank=root_rank,
                                  in_place=True)
    return Handle(call, lambda c: adapted[0].wrap(adapted[0].array), adapted)


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Every rank gets rank ``root_rank``'s ``tensor``.

    Args:
        tensor: an array of the same shape and dtype on every rank.
        root_rank: the job-wide rank whose value is sent.
        name, process_set: as :func:`allreduce`.

    Returns:
        A new array of the caller's kind holding the root's value.

    Raises:
        PreconditionError: ranks disagree on the root, or it is not a rank
            of the set; and the errors of :func:`allreduce`.

    Example:
        >>> weights = hvd.broadcast(weights, root_rank=0)
    """
    return broadcast_async(tensor, root_rank, name, process_set).wait()


def alltoall_async(tensor, splits=None, name=None, process_set=None):
    """Starts an alltoall; see :func:`alltoall`."""
    call, adapted, _, late = _submit(_ALLTOALL, [tensor], name,
                                     process_set, splits=splits)

    def result(c):
        out = _outputs(adapted, late)[0]
        if splits is None:
            return out
        return out, np.asarray(c.received_splits()[0], np.int32)
    return Handle(call, result, adapted)


def alltoall(tensor, splits=None, name=None, process_set=None):
    """Sends rows of ``tensor`` to every rank and receives theirs: the first
    ``splits[0]`` rows go to rank 0, the next ``splits[1]`` to rank 1, ...

    Args:
        tensor: an array with at least one dimension.
        splits: rows for each rank (one integer per rank, summing to the
            first dimension); None splits the first dimension evenly.
        name, process_set: as :func:`allreduce`.

    Returns:
        Without ``splits``: the received array (the ranks' rows in rank
        order). With ``splits``: (received array, received_splits), the
        latter a numpy int32 array of the rows received from each rank.

    Raises:
        InvalidArgumentError: splits of the wrong length, negative, or not
            summing to the first dimension; a first dimension not divisible
            by the number of ranks without splits. And the errors of
            :func:`allreduce`.

    Example:
        >>> out, received = hvd.alltoall(np.arange(4), splits=[1, 3])  # at np=2
    """
    return alltoall_async(tensor, splits, name, process_set).wait()


def reducescatter_async(tensor, op=Average, name=None, process_set=None,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; see :func:`reducescatter`."""
    handle, name = _submit_array(_REDUCESCATTER, tensor, name, process_set, op,
                                 prescale_factor, postscale_factor)
    if handle is not None:
        return handle
    call, adapted, _, late = _submit(_REDUCESCATTER, [tensor],
                                     name, process_set, op=op,
                                     prescale=prescale_factor, postscale=postscale_factor)
    return Handle(call, lambda c: _outputs(adapted, late)[0], adapted)


def reducescatter(tensor, op=Average, name=None, process_set=None, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over the ranks and gives each rank its slice of
    the first dimension (rank r gets rows [r*n/size, (r+1)*n/size), the
    first ranks one more row when it does not divide evenly).

    Args:
        tensor: an array with at least one dimension, the same shape on
            every rank.
        op: Average (default) or Sum (Min, Max and Product too).
        name, process_set, prescale_factor, postscale_factor: as
            :func:`allreduce`.

    Returns:
        A new array of the caller's kind: this rank's slice of the result.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> part = hvd.reducescatter(np.ones((hvd.size() * 2, 3)), op=hvd.Sum)
    """
    return reducescatter_async(tensor, op, name, process_set, prescale_factor,
                               postscale_factor).wait()


def grouped_reducescatter_async(tensors, op=Average, name=None, process_set=None,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a grouped reducescatter; see :func:`grouped_reducescatter`."""
    call, adapted, _, late = _submit(_REDUCESCATTER, list(tensors), name, process_set,
                                     grouped=True, op=op, prescale=prescale_factor,
                                     postscale=postscale_factor)
    return Handle(call, lambda c: _outputs(adapted, late), adapted)


def grouped_reducescatter(tensors, op=Average, name=None, process_set=None,
                          prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatters a list of arrays as one group.

    Args:
        tensors: a list of arrays, all on one device, the same on every rank.
        op, name, process_set, prescale_factor, postscale_factor: as
            :func:`reducescatter`.

    Returns:
        A list of new arrays: this rank's slice of each result.

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> a, b = hvd.grouped_reducescatter([np.ones((4, 2)), np.ones(6)], op=hvd.Sum)
    """
    return grouped_reducescatter_async(tensors, op, name, process_set, prescale_factor,
                                       postscale_factor).wait()


def barrier(process_set=None):
    """Blocks until every rank of the set has called barrier().

    Raises:
        The errors of :func:`allreduce`.

    Example:
        >>> hvd.barrier()
    """
    name = _auto_name("barrier", process_set)
    Handle(_require_init().barrier(_process_set_id(process_set), name), lambda c: None).wait()


def join(process_set=None):
    """Tells the other ranks this one has no more allreduces (they count it
    as zeros) and waits until every rank has joined.

    Returns:
        The rank that joined last.

    Example:
        >>> last = hvd.join()
    """
    return Handle(_require_init().join(_process_set_id(process_set)),
                  lambda c: c.int_result()).wait()
