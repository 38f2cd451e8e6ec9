"""The collectives one by one, on every rank.

Run:  tfringrun -np 2 python examples/collectives_basics.py
"""
import tensorflow as tf

import tfring.tensorflow as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()

x = tf.constant([1.0, 2.0]) * (rank + 1)
summed = hvd.allreduce(x, op=hvd.Sum)                 # the same on every rank
gathered = hvd.allgather(tf.fill([rank + 1, 2], rank))  # rows from every rank
weights = hvd.broadcast(tf.random.normal([3]), root_rank=0)
config = hvd.broadcast_object({"lr": 0.1} if rank == 0 else None, root_rank=0)


@tf.function
def step(values):
    # Inside tf.function, many small allreduces are negotiated and fused together.
    return [hvd.allreduce(v) for v in values]


averaged = step([tf.fill([4], float(rank + i)) for i in range(10)])

print(f"rank {rank}/{size}: sum={summed.numpy()} gathered rows={gathered.shape[0]} "
      f"broadcast={weights.numpy().round(3)} config={config} "
      f"average[0]={averaged[0].numpy()[0]}")
hvd.shutdown()
