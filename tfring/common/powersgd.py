"""PowerSGD gradient compression (Vogels, Karimireddy and Jaggi, NeurIPS
2019), framework-free: the settings and their checks, which gradients are
compressed, and one round of the algorithm over a binding's matrix ops.
tfring.tensorflow.powersgd and tfring.torch.powersgd keep the state (one Q
matrix and one error-feedback matrix per compressed gradient, and the step)
in their own tensors.

One round for a gradient M (n x m, the gradient reshaped to its first
dimension by the rest) with error feedback E and warm-started Q (m x r):

    M += E;  P = M Q;  P = allreduce_mean(P);  P = orthonormal(P)
    Q = M^T P;  Q = allreduce_mean(Q);  approximation = P Q^T;  E = M - approximation

Every rank gets the same rank-r approximation of the average of the ranks'
M, having sent (n + m) r numbers instead of n m. The part the approximation
missed is added to the next step's gradient on the same rank (error
feedback), so nothing is lost for good. Like torch DDP's PowerSGD hook,
gradients of rank 0 or 1, and those whose n m is less than
`min_compression_rate` (n + m) r, are averaged uncompressed, and so is every
gradient before `start_step` (compression early in training, when gradients
change fast, costs accuracy).
"""
import math
import numbers


class PowerSGDSettings:
    """The settings of a PowerSGD compressor, checked.

    Args:
        rank: the rank r of the approximation (1-4 is usual; higher is
            closer to uncompressed and sends more).
        start_step: reduce uncompressed for this many steps first.
        min_compression_rate: compress a gradient only if it shrinks at
            least this many times.
        warm_start: reuse each step's Q as the next step's start (one power
            iteration per step that carries over); False draws a new Q.
        seed: seeds the first Q (the same on every rank).

    Raises:
        ValueError: a setting out of range, naming it.
        TypeError: a setting of the wrong type.

    Example:
        >>> PowerSGDSettings(rank=2, start_step=100).rank
        2
    """

    stateful = True

    def __init__(self, rank=1, start_step=10, min_compression_rate=2.0, warm_start=True, seed=0):
        for name, value in (("rank", rank), ("start_step", start_step), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"Compression.powersgd: {name} must be an int, not {value!r}")
        if rank < 1:
            raise ValueError(f"Compression.powersgd: rank must be at least 1, not {rank}")
        if start_step < 0:
            raise ValueError(f"Compression.powersgd: start_step must be >= 0, not {start_step}")
        if (isinstance(min_compression_rate, bool)
                or not isinstance(min_compression_rate, numbers.Real)
                or not min_compression_rate >= 1):
            raise ValueError("Compression.powersgd: min_compression_rate must be a number >= 1, "
                             f"not {min_compression_rate!r}")
        if not isinstance(warm_start, bool):
            raise TypeError(f"Compression.powersgd: warm_start must be a bool, not {warm_start!r}")
        self.rank = int(rank)
        self.start_step = int(start_step)
        self.min_compression_rate = float(min_compression_rate)
        self.warm_start = warm_start
        self.seed = int(seed)

    def matrix_shape(self, shape):
        """(n, m, r) for a gradient of `shape` that is compressed, else None."""
        shape = tuple(int(d) for d in shape)
        if len(shape) < 2:
            return None
        n, m = shape[0], math.prod(shape[1:])
        r = min(self.rank, n, m)
        if n * m < self.min_compression_rate * (n + m) * r:
            return None
        return n, m, r

    def check_reduction(self, op_is_average, where):
        """Refuses an op PowerSGD cannot approximate (it averages)."""
        if not op_is_average:
            raise ValueError(f"{where}: Compression.powersgd averages gradients; use op=Average")

    def __repr__(self):
        return (f"PowerSGD(rank={self.rank}, start_step={self.start_step}, "
                f"min_compression_rate={self.min_compression_rate}, "
                f"warm_start={self.warm_start}, seed={self.seed})")


def powersgd_round(matrices, qs, plain, allreduce_mean, ops):
    """One compressed round over all gradients of a step.

    Args:
        matrices: the compressed gradients as n x m matrices, error feedback
            already added.
        qs: their m x r starting Q matrices.
        plain: gradients reduced uncompressed; they travel with the P
            matrices in one request.
        allreduce_mean: averages a list of tensors across ranks, as one
            request.
        ops: the binding's ``mm(a, b, transpose_a=False, transpose_b=False)``
            and ``orthonormal(p)`` (orthonormal columns spanning p's).

    Returns:
        (approximations, new_qs, reduced_plain).
    """
    ps = [ops.mm(m, q) for m, q in zip(matrices, qs)]
    reduced = allreduce_mean(ps + list(plain)) if ps or plain else []
    ps, reduced_plain = reduced[:len(ps)], reduced[len(ps):]
    ps = [ops.orthonormal(p) for p in ps]
    new_qs = [ops.mm(m, p, transpose_a=True) for m, p in zip(matrices, ps)]
    new_qs = allreduce_mean(new_qs) if new_qs else []
    approximations = [ops.mm(p, q, transpose_b=True) for p, q in zip(ps, new_qs)]
    return approximations, new_qs, reduced_plain
