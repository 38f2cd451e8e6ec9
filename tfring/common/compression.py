"""The framework-free part of Horovod's Compression API: the Compressor
interface, the compressor that changes nothing, the rule by which a
compressor divides before the sum, and the check every binding runs on a
``compression=`` argument. Each binding adds its casting compressors and the
``Compression`` namespace (tfring.tensorflow.compression,
tfring.torch.compression); PowerSGD, which needs state and two collectives,
lives in tfring.common.powersgd."""


class Compressor:
    """Interface: compress before the collective, decompress after.

    A compressor whose ``predivide`` is True is summed, not averaged: with
    op=Average each floating-point tensor is first multiplied by
    ``prescale_factor / size`` in its own dtype, then compressed, then
    summed. The partial sums of a ring then stay within the largest
    rank's own values, so a float16 or bfloat16 sum cannot overflow where
    the inputs did not (Horovod's fp16 sums first and divides after).
    """

    predivide = False

    @staticmethod
    def compress(tensor):
        """Returns (compressed_tensor, context)."""
        raise NotImplementedError("Compressor subclasses implement compress()")

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor restored with the context from compress()."""
        raise NotImplementedError("Compressor subclasses implement decompress()")


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def check_compression(compression, where, stateful_ok=False):
    """Returns `compression` (None as NoneCompressor) if it is a compressor.

    Args:
        compression: a Compressor class or instance, e.g. Compression.fp16 or
            Compression.powersgd(rank=2); None for no compression.
        where: the API being called, for the message.
        stateful_ok: whether a stateful compressor (PowerSGD) is accepted:
            only the gradient reducers (DistributedOptimizer,
            DistributedGradientTape) keep its state.

    Returns:
        The compressor to use.

    Raises:
        TypeError: anything else, e.g. the string "fp16", the factory
            Compression.powersgd not called, or PowerSGD given to a plain
            collective.

    Example:
        >>> check_compression(None, "allreduce") is NoneCompressor
        True
    """
    if compression is None:
        return NoneCompressor
    if getattr(compression, "is_compressor_factory", False):
        raise TypeError(f"{where}: compression={compression.__name__} must be called, e.g. "
                        f"compression=Compression.{compression.__name__}(rank=2)")
    if getattr(compression, "stateful", False):
        if not stateful_ok:
            raise TypeError(f"{where}: {type(compression).__name__} keeps state per gradient: "
                            "pass it to DistributedOptimizer or DistributedGradientTape, not "
                            "to a collective")
        return compression
    if not (callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"{where}: compression must be a Compressor such as Compression.none, "
                        f"Compression.fp16, Compression.bf16 or Compression.powersgd(...), "
                        f"not {compression!r}")
    return compression


def predivide_plan(compression, op, average_op, sum_op, prescale_factor, size_fn):
    """How an allreduce with a predividing compressor is run.

    Args:
        compression: the compressor.
        op, average_op, sum_op: the requested op and the binding's Average
            and Sum.
        prescale_factor: the requested prescale factor.
        size_fn: returns the process set's size (called only when needed).

    Returns:
        (factor, op, prescale_factor): when `factor` is not None, multiply
        each floating-point tensor by it before compress() and reduce with
        the returned op (Sum) and prescale (1.0); otherwise as requested.

    Example:
        >>> predivide_plan(FP16, Average, Average, Sum, 1.0, lambda: 4)
        (0.25, Sum, 1.0)
    """
    if getattr(compression, "predivide", False) and op == average_op:
        return prescale_factor / size_fn(), sum_op, 1.0
    return None, op, prescale_factor
