"""The framework-free part of Horovod's Compression API: the Compressor
interface and the compressor that changes nothing. Each binding adds its
FP16Compressor and the ``Compression`` namespace."""


class Compressor:
    """Interface: compress before the collective, decompress after."""

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
