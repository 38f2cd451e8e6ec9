"""Arrays of any kind as the raw buffers the core takes, and new arrays of
the caller's kind for the results.

:func:`adapt` turns an array into an :class:`Adapted`: its data pointer,
shape, core dtype code, device (``-1`` for host memory, else the GPU
ordinal) and stream, plus ``new(shape)``, which makes an empty array of the
same kind, dtype and device. Kinds, tried in this order:

* numpy arrays (host memory);
* torch tensors (``data_ptr()``, ``.device.index``; CPU or CUDA, bfloat16
  included, which ``__cuda_array_interface__`` cannot describe);
* anything with ``__cuda_array_interface__`` (CuPy, Numba, ...): the device
  from ``.device.id`` (CuPy) or ``.device.index``, the stream from the
  interface's ``stream`` key, else CuPy's current stream; results are CuPy
  arrays (CuPy in, CuPy out);
* anything with ``__dlpack__``/``__dlpack_device__``: host memory is read
  through numpy and results come back through the input's package's
  ``from_dlpack``; CUDA memory goes through CuPy the same way.

Inputs that are not C-contiguous are copied first (a contiguous copy of the
caller's kind). Nothing here imports numpy's rivals unless the caller's array
is one of theirs.
"""
import sys

import numpy as np

# Core dtype codes (tf_ops/common/common.h, DataType): part of the wire
# format, never renumbered.
_CODES = {"uint8": 0, "int8": 1, "uint16": 2, "int16": 3, "int32": 4, "int64": 5,
          "float16": 6, "bfloat16": 7, "float32": 8, "float64": 9, "bool": 10}
CPU = -1
# DLPack device types (dlpack.h).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST = 1, 2, 3


def dtype_code(name, what="array"):
    """The core's code for a dtype name ("float32", "bfloat16", ...).

    Raises:
        TypeError: the core has no such dtype (the message lists those it has).
    """
    code = _CODES.get(str(name))
    if code is None:
        raise TypeError(f"tfring: collectives do not support dtype {name} (of a {what}); "
                        f"supported: {', '.join(_CODES)}")
    return code


class Adapted:
    """One array seen as a raw buffer.

    Attributes:
        array: the (C-contiguous) array whose memory is used.
        ptr, shape, dtype, code, device, stream: what the core is given.
        new: callable(shape) -> empty array of the same kind, dtype, device.
        ptr_of: callable(array made by ``new``) -> its data pointer.
        wrap: callable(array made by ``new``) -> what the caller gets back.
    """

    def __init__(self, array, ptr, shape, dtype, device, stream, new, ptr_of, wrap=None,
                 code=None):
        self.array = array
        self.ptr = int(ptr)
        self.shape = tuple(int(d) for d in shape)
        self.dtype = str(dtype)
        self.code = dtype_code(self.dtype, type(array).__name__) if code is None else code
        self.device = int(device)
        self.stream = int(stream or 0)
        self.new = new
        self.ptr_of = ptr_of
        self.wrap = wrap or (lambda a: a)

    def new_adapted(self, shape):
        """A new empty array of this one's kind, dtype, device and stream,
        already adapted: an output is not inspected again as an input is
        (on a GPU that inspection costs as much as a small collective)."""
        array = self.new(shape)
        return Adapted(array, self.ptr_of(array), shape, self.dtype, self.device, self.stream,
                       self.new, self.ptr_of, self.wrap, self.code)


def _numpy(x):
    # Not np.ascontiguousarray: it makes a 0-d array 1-d.
    x = np.asarray(x)
    if not x.flags.c_contiguous:
        x = x.copy(order="C")
    name = x.dtype.name
    return Adapted(x, x.ctypes.data, x.shape, name, CPU, 0,
                   lambda shape: np.empty(shape, x.dtype), _numpy_ptr)


def _numpy_ptr(x):
    return x.__array_interface__["data"][0]


def _torch(x):
    # x is a torch tensor, so torch is loaded; no import statement here keeps
    # torch out of everything but tfring.torch (tests/build/test_layering.py).
    torch = sys.modules["torch"]
    x = x.contiguous()
    name = str(x.dtype).replace("torch.", "")
    if x.device.type == "cpu":
        device, stream = CPU, 0
    elif x.device.type == "cuda":
        device = x.device.index if x.device.index is not None else torch.cuda.current_device()
        stream = torch.cuda.current_stream(device).cuda_stream
    else:
        raise TypeError(f"tfring: torch tensors on {x.device} are not supported (CPU or CUDA)")
    return Adapted(x, x.data_ptr(), tuple(x.shape), name, device, stream,
                   lambda shape: torch.empty(shape, dtype=x.dtype, device=x.device),
                   lambda t: t.data_ptr())


def _cuda_device(x):
    device = getattr(x, "device", None)
    for attr in ("id", "index"):
        value = getattr(device, attr, None)
        if isinstance(value, int):
            return value
    try:
        import cupy
    except ImportError:
        raise TypeError(f"tfring: cannot tell which GPU a {type(x).__name__} is on (it has no "
                        ".device.id or .device.index, and CuPy is not installed)") from None
    ptr = x.__cuda_array_interface__["data"][0]
    return cupy.cuda.runtime.pointerGetAttributes(ptr).device


def _cupy_current_stream(device):
    try:
        import cupy
    except ImportError:
        return 0  # the legacy default stream
    if cupy.cuda.runtime.getDevice() == device:  # switching devices costs microseconds
        return cupy.cuda.get_current_stream().ptr
    with cupy.cuda.Device(device):
        return cupy.cuda.get_current_stream().ptr


def _cuda_interface(x):
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        import cupy
        return _cuda_interface(cupy.ascontiguousarray(cupy.asarray(x)))
    device = _cuda_device(x)
    # CAI v3: `stream` is the producer's stream (1: legacy default, 2:
    # per-thread default); absent or None: the producer synchronised, and
    # CuPy's current stream orders what follows.
    stream = cai.get("stream")
    if stream is None:
        stream = _cupy_current_stream(device) if "cupy" in sys.modules else 0

    def new(out_shape):
        import cupy
        if cupy.cuda.runtime.getDevice() == device:
            return cupy.empty(out_shape, dtype)
        with cupy.cuda.Device(device):
            return cupy.empty(out_shape, dtype)
    return Adapted(x, cai["data"][0], shape, dtype.name, device, stream, new, _cuda_ptr)


def _cuda_ptr(x):
    return x.__cuda_array_interface__["data"][0]


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def _dlpack(x):
    device_type, device_id = x.__dlpack_device__()
    package = sys.modules.get(type(x).__module__.split(".")[0])
    back = getattr(package, "from_dlpack", None)
    if device_type in (_DL_CPU, _DL_CUDA_HOST):
        a = _numpy(np.from_dlpack(x))
    elif device_type == _DL_CUDA:
        try:
            import cupy
        except ImportError:
            raise TypeError(f"tfring: a {type(x).__name__} on a GPU is read through CuPy, "
                            "which is not installed") from None
        a = _cuda_interface(cupy.from_dlpack(x))
    else:
        raise TypeError(f"tfring: DLPack device type {device_type} (of a {type(x).__name__}) is "
                        "not supported: host memory or CUDA only")
    if back is not None:
        a.wrap = back
    return a


def adapt(x):
    """The raw-buffer view of ``x`` (see the module docstring for the kinds).

    Args:
        x: a numpy array (or anything numpy turns into one: lists, scalars),
            a torch tensor, an object with ``__cuda_array_interface__`` or
            with ``__dlpack__``.

    Returns:
        An :class:`Adapted`.

    Raises:
        TypeError: the dtype is not one the core has, or the kind/device is
            not supported.

    Example:
        >>> adapt(np.zeros(3, np.float32)).device
        -1
    """
    if isinstance(x, np.ndarray) or np.isscalar(x) or isinstance(x, (list, tuple)):
        return _numpy(x)
    if type(x).__module__.split(".")[0] == "torch" and hasattr(x, "data_ptr"):
        return _torch(x)
    if hasattr(x, "__cuda_array_interface__"):
        return _cuda_interface(x)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _dlpack(x)
    if hasattr(x, "__array__") or hasattr(x, "__array_interface__"):
        return _numpy(np.asarray(x))
    raise TypeError(f"tfring: cannot use a {type(x).__name__} as an array: pass a numpy array, "
                    "a torch tensor, or an object with __cuda_array_interface__ or __dlpack__")


def caller_stream(x, submitted=0):
    """The stream that the library of GPU array ``x`` now queues its work
    on (the caller's current stream): a device collective's wait makes it
    wait for the collective on the device (complete by event), so that
    what the caller queues next reads the result.

    Args:
        x: a torch CUDA tensor, a CuPy array, or another array with
            ``__cuda_array_interface__``.
        submitted: the stream recorded when ``x`` was submitted, used for a
            library whose current stream tfring cannot ask.

    Returns:
        The stream's handle (a ``cudaStream_t`` as an int; 0 is the legacy
        default stream).

    Example:
        >>> stream = caller_stream(x)  # torch.cuda.current_stream().cuda_stream
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        device = x.get_device()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return raw(device) if raw else torch.cuda.current_stream(device).cuda_stream
    if "cupy" in sys.modules and type(x).__module__.partition(".")[0] == "cupy":
        return _cupy_current_stream(_cuda_device(x))
    return submitted


def one_call_gpu(kind):
    """How the one-call GPU path (``_tfring_core.submit_device``) takes
    arrays of type ``kind``: a function ``prepare(x, in_place)`` that gives
    (the stream that produced ``x``, or None for the one its
    ``__cuda_array_interface__`` names; the output array: ``x`` itself in
    place, else an empty one like it), or None for an ``x`` it does not
    take (a CPU tensor, one that requires grad). None for a type it never
    takes: the general path (:func:`adapt`) handles those.

    Example:
        >>> prepare = one_call_gpu(type(x))  # x a CuPy array
        >>> stream, out = prepare(x, in_place=False)
    """
    library = kind.__module__.partition(".")[0]
    if library == "cupy" and kind.__name__ == "ndarray":
        # CuPy names its current stream in the interface (CAI v3).
        empty_like = sys.modules["cupy"].empty_like
        return lambda x, in_place: (None, x if in_place else empty_like(x))
    torch = sys.modules.get("torch")
    if library == "torch" and torch is not None and kind is torch.Tensor:
        # torch's interface (CAI v2) names no stream: its current one made x.
        # The raw accessor is what torch's own compilers use; the public
        # call costs microseconds more.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)

        def prepare(x, in_place):
            if not x.is_cuda or x.requires_grad:
                return None
            device = x.get_device()
            stream = raw(device) if raw else torch.cuda.current_stream(device).cuda_stream
            return stream, x if in_place else torch.empty_like(x)
        return prepare
    return None
