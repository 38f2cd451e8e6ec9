"""Gradient compression for tfring.torch, with Horovod's names:
``Compression.none`` and ``Compression.fp16`` (floating-point tensors travel
as float16 and come back in their own dtype).

Example:
    >>> sent, ctx = Compression.fp16.compress(torch.ones(3))
    >>> Compression.fp16.decompress(sent, ctx).dtype
    torch.float32
"""
import torch

from tfring.common.compression import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (others as they are)."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)


class Compression:
    """The compressors, by Horovod's names: ``none`` and ``fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
