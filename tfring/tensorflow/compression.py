"""Gradient compression applied around a collective (Horovod's Compression
API, plus bfloat16).

``Compression.fp16`` and ``Compression.bf16`` send floating-point tensors in
16 bits and, with op=Average, divide by the process set's size before the
sum (see tfring.common.compression.Compressor), so the 16-bit sum cannot
overflow where each rank's own values did not. Horovod's fp16 divided after
the sum; the average is the same number, reached without the overflow.

Example:
    >>> opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.bf16)
"""
import tensorflow as tf

from tfring.common.compression import Compressor, NoneCompressor  # noqa: F401


class _CastCompressor(Compressor):
    """Sends floating-point tensors other than `wire` (and `keep`) as `wire`."""

    predivide = True
    wire = None
    keep = ()

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating and tensor.dtype != cls.wire and tensor.dtype not in cls.keep:
            return tf.cast(tensor, cls.wire), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tf.cast(tensor, ctx) if ctx is not None else tensor


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16, halving float32's bytes.
    float16 keeps 11 bits of mantissa but only values below 65504."""

    wire = tf.float16


class BF16Compressor(_CastCompressor):
    """Sends float32/float64 tensors as bfloat16 (float16 ones as they
    are): float32's range with 8 bits of mantissa."""

    wire = tf.bfloat16
    keep = (tf.float16,)


class Compression:
    """The available compressors: ``none``, ``fp16`` and ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
