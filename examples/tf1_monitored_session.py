"""TF1 graph mode: a tf.compat.v1 optimizer and a MonitoredTrainingSession.

Run:  tfringrun -np 2 python examples/tf1_monitored_session.py [--steps 500]

Eager execution is turned off and a softmax-regression-plus-hidden-layer model
is built from tf.compat.v1 variables and ops. ``hvd.DistributedOptimizer``
wraps a ``tf.compat.v1.train`` optimizer so its gradients are averaged across
ranks; ``hvd.BroadcastGlobalVariablesHook(0)`` gives every rank rank 0's
initial variables once the session exists. Each rank feeds batches from its
shard of scikit-learn's digits; only rank 0 writes checkpoints (and prints).
At the end rank 0 prints the first batch's loss and the mean of the last 10
batches' losses (each averaged over ranks): ``first_loss=2.2598
final_loss=0.1570`` after the default 500 steps at np=2, in about 5 s on an
idle 2-core VM.
"""
import argparse
import tempfile

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfring.tensorflow as hvd

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=500, help="training steps per rank")
parser.add_argument("--batch-size", type=int, default=32, help="batch size per rank")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
parser.add_argument("--checkpoint-dir", default=None, help="default: a new temporary directory")
args = parser.parse_args()

tf.compat.v1.disable_eager_execution()
hvd.init()
rank, size = hvd.rank(), hvd.size()

digits = load_digits()
x_all = (digits.data / 16.0).astype(np.float32)
y_all = digits.target.astype(np.int64)
x_shard, y_shard = x_all[rank::size], y_all[rank::size]

images = tf.compat.v1.placeholder(tf.float32, [None, 64])
labels = tf.compat.v1.placeholder(tf.int64, [None])
init = tf.compat.v1.glorot_uniform_initializer(seed=rank)  # differs per rank until broadcast
w1 = tf.compat.v1.get_variable("w1", [64, 64], initializer=init)
b1 = tf.compat.v1.get_variable("b1", [64], initializer=tf.compat.v1.zeros_initializer())
w2 = tf.compat.v1.get_variable("w2", [64, 10], initializer=init)
b2 = tf.compat.v1.get_variable("b2", [10], initializer=tf.compat.v1.zeros_initializer())
logits = tf.matmul(tf.nn.relu(tf.matmul(images, w1) + b1), w2) + b2
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                     logits=logits))
mean_loss = hvd.allreduce(loss, name="mean_loss")  # this rank's loss averaged over ranks

global_step = tf.compat.v1.train.get_or_create_global_step()
opt = tf.compat.v1.train.GradientDescentOptimizer(args.lr * size)  # scale lr by the ranks
opt = hvd.DistributedOptimizer(opt)  # averages gradients across ranks
train_op = opt.minimize(loss, global_step=global_step)

hooks = [hvd.BroadcastGlobalVariablesHook(0),  # start every rank from rank 0's variables
         tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
checkpoint_dir = None
if rank == 0:  # only rank 0 writes checkpoints (and summaries)
    checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="tf1_monitored_session_")

rng = np.random.default_rng(rank)
losses = []
with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir,
                                                 hooks=hooks) as sess:
    while not sess.should_stop():
        batch = rng.choice(len(x_shard), args.batch_size, replace=False)
        _, batch_loss, step = sess.run([train_op, mean_loss, global_step],
                                       feed_dict={images: x_shard[batch], labels: y_shard[batch]})
        losses.append(batch_loss)
        if step % 100 == 0 and rank == 0:
            print(f"step {step}: loss {batch_loss:.4f}", flush=True)

if rank == 0:
    print(f"checkpoint_dir={checkpoint_dir}")
    print(f"first_loss={losses[0]:.4f} final_loss={np.mean(losses[-10:]):.4f}", flush=True)
hvd.shutdown()
