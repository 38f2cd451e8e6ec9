"""One rank of the GPU checks through ``tfring.torch`` with CUDA tensors.

Run under ``tfringrun --tcp -np N python torch_worker.py CHECK``. Every rank
prints ``RESULT <json>``; a failed check raises (the rank exits non-zero).

Checks:
  collectives  every collective on CUDA tensors (dtypes, ops, groups, async,
               in place, a gradient) against CPU references, and waits
               that complete by event (at np=1 the host returns while the
               stream is busy); reports how many copies host staging made
               (0 at np=1: all NCCL)
  train        DistributedOptimizer (SGD with momentum, then Adam) on a
               small MLP on the GPU against one process on the whole batch
"""
import json
import os
import sys
import time

import torch

import tfring.core
import tfring.torch as hvd

# "cpu" dry-runs the checks' logic on a machine without a GPU.
DEV = os.environ.get("TFRING_TORCH_WORKER_DEVICE", "cuda")


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def values(rank, shape, dtype):
    n = 1
    for d in shape:
        n *= d
    return (1 + (torch.arange(n).reshape(shape) + rank) % 3).to(dtype)


def check(got, want, what):
    assert got.device.type == DEV, f"{what}: result on {got.device}"
    tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
    torch.testing.assert_close(got.cpu().double(), want.double(), rtol=tol, atol=tol, msg=what)


def check_collectives():
    rank, size = hvd.rank(), hvd.size()
    before = tfring.core.host_staging_copies()
    everyone = lambda shape, dtype: torch.stack([values(r, shape, dtype) for r in range(size)])  # noqa: E731
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
                  torch.int64, torch.uint8):
        x = values(rank, (3, 5), dtype).to(DEV)
        check(hvd.allreduce(x, op=hvd.Sum), everyone((3, 5), dtype).double().sum(0),
              f"allreduce {dtype}")
        check(hvd.allreduce(x, op=hvd.Max), everyone((3, 5), dtype).double().max(0).values,
              f"max {dtype}")
        check(hvd.allgather(values(rank, (rank + 1, 2), dtype).to(DEV)),
              torch.cat([values(r, (r + 1, 2), dtype) for r in range(size)]).double(),
              f"allgather {dtype}")
        check(hvd.broadcast(x, root_rank=size - 1), values(size - 1, (3, 5), dtype).double(),
              f"broadcast {dtype}")
    y = values(rank, (4,), torch.float32).to(DEV)
    hvd.allreduce_(y, op=hvd.Sum, prescale_factor=0.5, postscale_factor=2.0)
    check(y, everyone((4,), torch.float32).double().sum(0), "allreduce_ scaled")
    a, b = hvd.grouped_allreduce([torch.ones(3, device=DEV), torch.ones(2, 2, device=DEV)],
                                 op=hvd.Sum)
    check(b, torch.full((2, 2), float(size)), "grouped")
    out, received = hvd.alltoall(torch.full((size * 2, 1), float(rank), device=DEV),
                                 splits=[2] * size)
    check(out, torch.arange(size).repeat_interleave(2).view(-1, 1).double(), "alltoall")
    assert received.tolist() == [2] * size
    check(hvd.reducescatter(torch.ones(size * 2, 3, device=DEV), op=hvd.Sum),
          torch.full((2, 3), float(size)), "reducescatter")
    h1 = hvd.allreduce_async(torch.ones(5, device=DEV), op=hvd.Sum)
    h2 = hvd.allgather_async(torch.ones(1, device=DEV))
    check(hvd.synchronize(h2), torch.ones(size), "async gather")
    check(hvd.synchronize(h1), torch.full((5,), float(size)), "async sum")
    w = torch.ones(3, device=DEV, requires_grad=True)
    hvd.allreduce(w * (rank + 1), op=hvd.Sum).sum().backward()
    check(w.grad, torch.full((3,), float(size * (rank + 1))), "allreduce gradient")
    if DEV == "cuda":
        # The one-call path (submit_device) takes CUDA tensors.
        from tfring.core import ops
        z = torch.full((1000,), float(rank + 1), device=DEV)
        h, _ = ops._submit_array(ops._ALLREDUCE, z, "torch.one.call", None, op=hvd.Sum,
                                 in_place=True)
        assert isinstance(h, ops._ArrayHandle), "a CUDA tensor went the general way"
        assert h.wait() is z and float(z.min()) == float(z.max()) == size * (size + 1) / 2
        torch.cuda.synchronize()
        by_event = check_complete_by_event(rank, size)
    else:
        by_event = None
    report(rank=rank, size=size, nccl_built=hvd.nccl_built(), by_event=by_event,
           host_copies=tfring.core.host_staging_copies() - before)


def check_complete_by_event(rank, size):
    """Complete by event, as torch.distributed's work.wait(): behind a
    kernel that keeps the current stream busy (about 0.1-0.2 s), the waits
    of allreduce, allreduce_ and synchronize() return with the stream still
    busy (at np=1, NCCL; host staging copies through the host, which
    waits), and the stream then reads the results."""
    stream = torch.cuda.current_stream()
    x = torch.full((1 << 20,), float(rank + 1), device=DEV)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))
    start = time.perf_counter()
    y = hvd.allreduce(x, op=hvd.Sum, name="by.event")
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="by.event.in.place")
    hvd.synchronize(h)
    g = hvd.grouped_allreduce([y, y], op=hvd.Sum, name="by.event.group")
    waited = time.perf_counter() - start
    busy = not stream.query()
    total = size * (size + 1) / 2
    check(y, torch.full((1 << 20,), total), "by event: allreduce")
    check(x, torch.full((1 << 20,), total), "by event: allreduce_")
    check(g[1], torch.full((1 << 20,), total * size), "by event: grouped")
    if size == 1 and hvd.nccl_built():
        assert busy, f"the waits took {waited:.3f} s and the stream was idle: the host waited"
    return {"waited_s": round(waited, 4), "stream_busy_after_wait": busy}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 1)).double().to(DEV)


def check_train():
    rank, size = hvd.rank(), hvd.size()
    rows = 8
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(size * rows, 6, generator=g, dtype=torch.float64).to(DEV),
             torch.randn(size * rows, 1, generator=g, dtype=torch.float64).to(DEV))
            for _ in range(4)]
    worst = {}
    for name, make in (("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
                       ("adam", lambda p: torch.optim.Adam(p, lr=0.01))):
        reference, model = _model(), _model()
        ref_opt = make(reference.parameters())
        opt = hvd.DistributedOptimizer(make(model.parameters()),
                                       named_parameters=model.named_parameters())
        mine = slice(rank * rows, (rank + 1) * rows)
        for x, y in data:
            ref_opt.zero_grad()
            torch.nn.functional.mse_loss(reference(x), y).backward()
            ref_opt.step()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            opt.step()
        diff = max(float((p - q).abs().max()) for p, q in zip(model.parameters(),
                                                               reference.parameters()))
        assert diff < 1e-5, (name, diff)
        worst[name] = diff
    report(rank=rank, size=size, max_abs_diff=worst)


if __name__ == "__main__":
    hvd.init()
    {"collectives": check_collectives, "train": check_train}[sys.argv[1]]()
    hvd.shutdown()
