"""Gradient compression for tfring.torch, with Horovod's names:
``Compression.none`` and ``Compression.fp16`` (floating-point tensors travel
as float16 and come back in their own dtype)."""
import torch


class Compressor:
    """Turns a tensor into what is sent, and back.

    Example:
        >>> sent, ctx = Compression.fp16.compress(torch.ones(3))
        >>> Compression.fp16.decompress(sent, ctx).dtype
        torch.float32
    """

    @staticmethod
    def compress(tensor):
        """Returns (tensor to send, context for decompress)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the received tensor in the form the caller gave it."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


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
