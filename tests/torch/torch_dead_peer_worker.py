"""Rank script for tests/torch/test_torch_faults.py: rank 1 of a
DistributedOptimizer job SIGKILLs itself after the first step; the others'
next step() fails. Each survivor prints
``RESULT <rank> <exception type> <is HorovodInternalError> <failing rank> <message>``."""
import os
import time

import torch

import tfring.torch as hvd

hvd.init()
model = torch.nn.Linear(4, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for step in range(2):
    if step == 1 and hvd.rank() == 1:
        time.sleep(0.5)
        os.kill(os.getpid(), 9)
    opt.zero_grad()
    model(torch.ones(3, 4)).sum().backward()
    try:
        opt.step()
    except Exception as e:  # noqa: BLE001 - reported for the test to judge
        print("RESULT", hvd.rank(), type(e).__name__, isinstance(e, hvd.HorovodInternalError),
              e.rank, " ".join(str(e).split()), flush=True)
        time.sleep(1.0)
        break
