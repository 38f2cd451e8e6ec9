"""An elastic PyTorch training script for tests/torch/test_torch_elastic.py:
TorchState with a model, a DistributedOptimizer and an ElasticSampler.

Environment: ELASTIC_KILL "worker:epoch:batch" SIGKILLs that worker before
that batch (counted in the sharding it is on).

Printed: SEEN epoch size idx,idx,... (each rank, per committed batch),
RESET epoch processed size (each survivor), FINAL rank json(weights).
"""
import json
import os
import signal

import torch

import tfring.torch as hvd

EPOCHS, BATCH, ROWS = 3, 4, 48


def main():
    hvd.init()
    wid = os.environ.get("TFRING_ELASTIC_WORKER")
    g = torch.Generator().manual_seed(11)
    x = torch.randn(ROWS, 6, generator=g)
    y = (x.sum(1, keepdim=True) > 0).float()
    torch.manual_seed(5 + hvd.rank())   # differs by rank: the first sync must fix it
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(list(range(ROWS)), shuffle=True, seed=3)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0)
    state.register_reset_callbacks([lambda: print(
        "RESET", state.epoch, state.sampler.processed_num, hvd.size(), flush=True)])

    @hvd.elastic.run
    def train(state):
        while state.epoch < EPOCHS:
            indices = list(state.sampler)
            for i in range(0, len(indices), BATCH):
                if f"{wid}:{state.epoch}:{i // BATCH}" in os.environ.get("ELASTIC_KILL", ""):
                    os.kill(os.getpid(), signal.SIGKILL)
                idx = indices[i:i + BATCH]
                opt.zero_grad()
                torch.nn.functional.binary_cross_entropy_with_logits(
                    model(x[idx]), y[idx]).backward()
                opt.step()
                state.sampler.record_batch(i // BATCH, BATCH)
                state.commit()
                print("SEEN", state.epoch, hvd.size(), ",".join(map(str, idx)), flush=True)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    weights = [p.detach().ravel().tolist() for p in model.parameters()]
    print("FINAL", hvd.rank(), json.dumps(weights), flush=True)


if __name__ == "__main__":
    main()
