"""TensorFlow's kernels on GPU tensors (marked `tf_gpu`): every collective
on tensors placed on the GPU, eagerly and in a tf.function, against numpy;
results that stay on the GPU; broadcasts into GPU variables. At np=1 the
core runs them on NCCL, with more ranks than GPUs on a host through host
staging. Skipped where TensorFlow sees no GPU (the `tf_gpu` fixture)."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
from test_collectives import REDUCTIONS, expected_reduction
from tf_helpers import assert_close, rank_values

pytestmark = pytest.mark.tf_gpu

# The dtypes NCCL reduces (int16, uint16 and bool it cannot).
GPU_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
              tf.float64]


def run_on(device, in_function, build):
    def placed():
        with tf.device(device):
            return build()
    return tf.function(placed)() if in_function else placed()


@pytest.mark.parametrize("in_function", [False, True])
def test_allreduce_on_gpu_tensors(tf_gpu, rank, size, in_function):
    def build():
        return {(dt.name, op): hvd.allreduce(tf.constant(rank_values(rank), dtype=dt), op=op,
                                             name=f"gpu_ar.{dt.name}.{op}")
                for dt in GPU_DTYPES for op in REDUCTIONS}
    out = run_on(tf_gpu, in_function, build)
    for dt in GPU_DTYPES:
        for op in REDUCTIONS:
            assert_close(out[(dt.name, op)], expected_reduction(op, dt, size), dt, f"op {op}")
    # A float result never left the GPU (TensorFlow keeps int32 on the host).
    assert "GPU" in out[("float32", hvd.Sum)].device


@pytest.mark.parametrize("in_function", [False, True])
def test_scale_factors_and_groups_on_gpu(tf_gpu, rank, size, in_function):
    def build():
        x = tf.constant(rank_values(rank), tf.float32)
        scaled = hvd.allreduce(x, op=hvd.Average, prescale_factor=3.0, postscale_factor=0.5,
                               name="gpu_scaled")
        group = hvd.grouped_allreduce([x, tf.constant(rank_values(rank, (5,)), tf.float64)],
                                      op=hvd.Sum, name="gpu_group")
        return scaled, group
    scaled, (a, b) = run_on(tf_gpu, in_function, build)
    total = np.stack([rank_values(r) for r in range(size)]).sum(0)
    assert_close(scaled, total * 1.5 / size, tf.float32)
    assert_close(a, expected_reduction(hvd.Sum, tf.float32, size), tf.float32)
    assert_close(b, expected_reduction(hvd.Sum, tf.float64, size, (5,)), tf.float64)


@pytest.mark.parametrize("in_function", [False, True])
def test_other_collectives_on_gpu_tensors(tf_gpu, rank, size, in_function):
    splits = [j + 1 for j in range(size)]

    def build():
        ragged = tf.constant(rank_values(rank, (rank + 1, 3)), tf.float32)
        gathered = hvd.allgather(ragged, name="gpu_ag")
        bcast = hvd.broadcast(tf.constant(rank_values(rank), tf.float16), root_rank=size - 1,
                              name="gpu_bc")
        rows = tf.constant(rank_values(rank, (sum(splits), 2)), tf.float32)
        received, received_splits = hvd.alltoall(rows, splits=splits, name="gpu_a2a")
        scattered = hvd.reducescatter(tf.constant(rank_values(rank, (2 * size + 1, 3)),
                                                  tf.float32), op=hvd.Sum, name="gpu_rs")
        return gathered, bcast, received, received_splits, scattered
    gathered, bcast, received, received_splits, scattered = run_on(tf_gpu, in_function, build)
    np.testing.assert_array_equal(
        gathered.numpy(), np.concatenate([rank_values(r, (r + 1, 3)) for r in range(size)]))
    assert_close(bcast, rank_values(size - 1), tf.float16)
    np.testing.assert_array_equal(received_splits.numpy(), [rank + 1] * size)
    mine = [rank_values(r, (sum(splits), 2))[sum(splits[:rank]):sum(splits[:rank + 1])]
            for r in range(size)]
    np.testing.assert_array_equal(received.numpy(), np.concatenate(mine))
    rows = 2 * size + 1
    full = np.stack([rank_values(r, (rows, 3)) for r in range(size)]).sum(0)
    starts = np.cumsum([0] + [rows // size + (1 if r < rows % size else 0) for r in range(size)])
    np.testing.assert_array_equal(scattered.numpy(), full[starts[rank]:starts[rank + 1]])
    assert "GPU" in gathered.device and "GPU" in received.device


def test_broadcast_variables_on_gpu(tf_gpu, rank, size):
    with tf.device(tf_gpu):
        v = tf.Variable(tf.constant(rank_values(rank), tf.float32))
        w = tf.Variable(tf.constant(rank_values(rank, (7,)), tf.int64))
        held = tf.identity(v)  # a reader that still holds v's buffer
    hvd.broadcast_variables([v, w], root_rank=0)
    np.testing.assert_array_equal(v.numpy(), rank_values(0))
    np.testing.assert_array_equal(w.numpy(), rank_values(0, (7,)))
    np.testing.assert_array_equal(held.numpy(), rank_values(rank))
    assert "GPU" in v.device
