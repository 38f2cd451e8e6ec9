"""SyncBatchNorm for tfring.torch: batch normalisation whose batch
statistics are those of every rank's batch together.

In training, each rank's per-channel count and sum are allreduced for the
mean, then the sums of squared deviations for the variance, both through
the differentiable allreduce: autograd's backward pass then reduces the
gradient sums across the ranks as well, so the input gradients are those of
BatchNorm over the whole (global) batch. Weight and bias gradients stay
local, for the DistributedOptimizer to average like every other gradient.
"""
import torch

import tfring.core as _core
from tfring.torch.differentiable import allreduce
from tfring.torch.mpi_ops import Sum


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """BatchNorm over the batches of every rank (any input of 2 or more
    dimensions, channels in dimension 1: BatchNorm1d/2d/3d alike).

    Args:
        num_features: the number of channels.
        eps, momentum, affine, track_running_stats: as torch.nn.BatchNorm2d
            (momentum None: a cumulative average).

    Raises:
        ValueError: an input with fewer than 2 dimensions.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), hvd.SyncBatchNorm(8))
    """

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm needs an input of 2 or more dimensions, "
                             f"not {input.dim()}")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or _core.size() == 1:
            return super().forward(input)
        dims = [d for d in range(input.dim()) if d != 1]
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() / input.shape[1]], dtype=input.dtype,
                             device=input.device)
        totals = allreduce(torch.cat([count, input.sum(dims)]), op=Sum,
                           name=None)
        n, mean = totals[0], totals[1:] / totals[0]
        centred = input - mean.view(shape)
        var = allreduce(centred.square().sum(dims), op=Sum) / n
        out = centred * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(n.detach()))
        return out

    def _update_running_stats(self, mean, var, n):
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                        else self.momentum)
            unbiased = var * (n / max(n - 1.0, 1.0))
            self.running_mean.mul_(1 - momentum).add_(mean, alpha=momentum)
            self.running_var.mul_(1 - momentum).add_(unbiased, alpha=momentum)


