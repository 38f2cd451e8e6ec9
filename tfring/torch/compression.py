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
    if not tensors or not all(t.dtype.is_floating_point for t in tensors):
        return tensors, op, prescale_factor
    factor, op, prescale_factor = predivide_plan(
        compression, op, Average, Sum, prescale_factor,
        lambda: process_set.size() if process_set is not None else _core.size())
    if factor is not None:
        tensors = [t * factor for t in tensors]
    return tensors, op, prescale_factor


class Compression:
    """The compressors, by Horovod's names: ``none``, ``fp16`` and ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
