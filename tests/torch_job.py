"""A PyTorch training step through tfring.torch that the Ray and Spark
runners' suites hand to their workers unchanged (as a Horovod user's
torch function), and its single-process reference."""


def train_step(lr=0.1):
    """One DistributedOptimizer step of a linear model from rank 0's weights,
    on data that differs by rank; returns this rank's view of the job."""
    import torch

    import tfring.torch as hvd
    hvd.init()
    torch.manual_seed(hvd.rank())  # different starting weights: the broadcast must fix them
    model = torch.nn.Linear(3, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters())
    x, y = batch(hvd.rank())
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "total": float(total[0]),
            "weights": [p.detach().reshape(-1).tolist() for p in model.parameters()]}


def batch(rank):
    import torch
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10 + rank
    return x, x.sum(dim=1, keepdim=True) * 0.5


def reference(size, lr=0.1):
    """The same step in one process on every rank's batch: what each rank's
    weights must equal (equal batches, so the average of the ranks' mean
    gradients is the whole batch's)."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys = zip(*(batch(r) for r in range(size)))
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys)).backward()
    opt.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]
