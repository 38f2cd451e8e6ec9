"""PowerSGD for tfring.torch's DistributedOptimizer: the algorithm is
tfring.common.powersgd's; here its state lives in torch tensors.

State, per compressed parameter (by its name in the optimizer): the m x r
matrix Q (the same on every rank) and the n x m error feedback (this rank's
own); and the step. ``DistributedOptimizer.state_dict()`` carries it under
"tfring_compression", so torch checkpoints and tfring.torch.elastic's
TorchState save, restore and sync it.
"""
import torch

from tfring.common.powersgd import PowerSGDSettings, powersgd_round


class _TorchOps:
    @staticmethod
    def mm(a, b, transpose_a=False, transpose_b=False):
        return torch.mm(a.t() if transpose_a else a, b.t() if transpose_b else b)

    @staticmethod
    def orthonormal(p):
        return torch.linalg.qr(p).Q


class PowerSGD(PowerSGDSettings):
    """A stateful PowerSGD compressor: give it to one DistributedOptimizer.

    Example:
        >>> opt = hvd.DistributedOptimizer(
        ...     opt, named_parameters=model.named_parameters(),
        ...     compression=hvd.Compression.powersgd(rank=2, start_step=100))
    """

    def __init__(self, **settings):
        super().__init__(**settings)
        self.step = 0
        self.qs = {}       # name -> Q
        self.errors = {}   # name -> error feedback
        self._rank = None  # the rank whose errors these are (see load_state_dict)

    def _q(self, name, m, r, like):
        q = self.qs.get(name)
        if q is None or not self.warm_start:
            g = torch.Generator().manual_seed(self.seed * 1000003 + self.step * 7919
                                              + sum(map(ord, name)))
            q = torch.randn(m, r, generator=g, dtype=like.dtype).to(like.device)
        return q

    def reduce(self, named_grads, allreduce_mean, rank):
        """Averages the gradients across ranks, compressed from start_step on.

        Args:
            named_grads: (name, dense gradient) pairs, in the same order on
                every rank.
            allreduce_mean: averages a list of tensors as one request.
            rank: this rank in the process set (whose errors these are).

        Returns:
            The averaged gradients, in order (new tensors).
        """
        self._rank = rank
        self.step += 1
        if self.step <= self.start_step:
            return allreduce_mean([g for _, g in named_grads])
        compressed, plain = [], []
        for i, (name, g) in enumerate(named_grads):
            shape = self.matrix_shape(g.shape) if g.dtype.is_floating_point else None
            (plain if shape is None else compressed).append((i, name, g, shape))
        matrices, qs = [], []
        for _, name, g, (n, m, r) in compressed:
            mat = g.reshape(n, m)
            error = self.errors.get(name)
            matrices.append(mat + error if error is not None else mat.clone())
            qs.append(self._q(name, m, r, mat))
        approx, new_qs, reduced_plain = powersgd_round(
            matrices, qs, [g for _, _, g, _ in plain], allreduce_mean, _TorchOps)
        out = [None] * len(named_grads)
        for (i, name, g, _), mat, a, q in zip(compressed, matrices, approx, new_qs):
            self.qs[name] = q
            self.errors[name] = mat.sub_(a)
            out[i] = a.reshape(g.shape)
        for (i, _, _, _), r in zip(plain, reduced_plain):
            out[i] = r
        return out

    def state_dict(self):
        """The state to checkpoint: step, Q matrices, error feedback and the
        rank it belongs to."""
        return {"step": self.step, "rank": self._rank,
                "qs": {k: v.clone() for k, v in self.qs.items()},
                "errors": {k: v.clone() for k, v in self.errors.items()}}

    def load_state_dict(self, state, rank):
        """Restores `state`. The error feedback is kept only if `state` was
        saved by this same `rank`: another rank's residual added here would
        be counted twice in the average, so a rank given someone else's
        state (a broadcast after an elastic reset, one checkpoint loaded
        everywhere) starts with none.

        Raises:
            ValueError: `state` is not a PowerSGD state.
        """
        if not isinstance(state, dict) or not {"step", "qs", "errors"} <= set(state):
            raise ValueError("PowerSGD.load_state_dict: not a PowerSGD state (it needs step, "
                             "qs and errors)")
        self.step = int(state["step"])
        self.qs = {k: v.clone() for k, v in state["qs"].items()}
        own = state.get("rank") is not None and state.get("rank") == rank
        self.errors = {k: v.clone() for k, v in state["errors"].items()} if own else {}
        self._rank = rank
