"""Gradient compression for tfring.torch, with Horovod's names:
``Compression.none``, ``Compression.fp16`` and ``Compression.bf16``.
Floating-point tensors travel in 16 bits and come back in their own dtype;
with op=Average they are divided by the process set's size before the sum
(see tfring.common.compression.Compressor), so the 16-bit sum cannot
overflow where each rank's own values did not.

Example:
    >>> sent, ctx = Compression.bf16.compress(torch.ones(3))
    >>> Compression.bf16.decompress(sent, ctx).dtype
    torch.float32
"""
import torch

from tfring.common.compression import Compressor, NoneCompressor, predivide_plan  # noqa: F401


class _CastCompressor(Compressor):
    """Sends floating-point tensors other than `wire` (and `keep`) as `wire`."""

    predivide = True
    wire = None
    keep = ()

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != cls.wire and \
                tensor.dtype not in cls.keep:
            return tensor.to(cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (others as they are)."""

    wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends float32/float64 tensors as bfloat16 (float16 ones as they are)."""

    wire = torch.bfloat16
    keep = (torch.float16,)


def predivide(tensors, compression, op, prescale_factor, process_set):
    """Applies a predividing compressor's rule to torch tensors: returns the
    tensors (new ones, times prescale/size, when it applies), the op and the
    prescale factor to reduce them with. Only all-floating requests are
    predivided, since one request has one op."""
    import tfring.core as _core
    from tfring.torch.mpi_ops import Average, Sum
    # Anything but floating tensors goes on as it is, for the collective's own
    # checks to refuse (a non-tensor is a TypeError there).
    if not getattr(compression, "predivide", False) or not tensors or not all(
            isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in tensors):
        return tensors, op, prescale_factor
    factor, op, prescale_factor = predivide_plan(
        compression, op, Average, Sum, prescale_factor,
        lambda: process_set.size() if process_set is not None else _core.size())
    if factor is not None:
        tensors = [t * factor for t in tensors]
    return tensors, op, prescale_factor


def powersgd(rank=1, start_step=10, min_compression_rate=2.0, warm_start=True, seed=0):
    """A new PowerSGD compressor (tfring.common.powersgd) for one
    DistributedOptimizer; arguments as PowerSGDSettings.

    Raises:
        ValueError, TypeError: a bad setting.

    Example:
        >>> hvd.Compression.powersgd(rank=2, start_step=100)
    """
    from tfring.torch.powersgd import PowerSGD
    return PowerSGD(rank=rank, start_step=start_step, min_compression_rate=min_compression_rate,
                    warm_start=warm_start, seed=seed)


powersgd.is_compressor_factory = True


class Compression:
    """The compressors: ``none``, ``fp16`` (Horovod's), ``bf16`` and
    ``powersgd(rank=..., start_step=...)`` (stateful: a new one per
    optimizer)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    powersgd = staticmethod(powersgd)
