"""Gradient compression applied around a collective (Horovod's Compression API)."""
import tensorflow as tf

from tfring.common.compression import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16, halving the bytes on the wire."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None else tensor


class Compression:
    """The available compressors: Compression.none and Compression.fp16."""

    none = NoneCompressor
    fp16 = FP16Compressor
