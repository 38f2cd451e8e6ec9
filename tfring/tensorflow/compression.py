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


def powersgd(rank=1, start_step=10, min_compression_rate=2.0, warm_start=True, seed=0):
    """A new PowerSGD compressor (tfring.common.powersgd) for one
    DistributedOptimizer or DistributedGradientTape; arguments as
    PowerSGDSettings. Its state: see tfring.tensorflow.powersgd.

    Raises:
        ValueError, TypeError: a bad setting.

    Example:
        >>> hvd.Compression.powersgd(rank=2, start_step=100)
    """
    from tfring.tensorflow.powersgd import PowerSGD
    return PowerSGD(rank=rank, start_step=start_step, min_compression_rate=min_compression_rate,
                    warm_start=warm_start, seed=seed)


powersgd.is_compressor_factory = True


class Compression:
    """The compressors: ``none``, ``fp16`` (Horovod's), ``bf16`` and
    ``powersgd(rank=..., start_step=...)`` (stateful: a new one per
    optimizer or tape)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    powersgd = staticmethod(powersgd)
