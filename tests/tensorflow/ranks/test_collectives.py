"""Every collective, in eager mode, in tf.function and in TF1 graph mode (and,
where XLA can run it, in tf.function(jit_compile=True)), checked against
numpy from rank-dependent inputs."""
import numpy as np
import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
from error_helpers import Background
from tf_helpers import DTYPES, MODES_WITH_XLA, assert_close, rank_values, run, tf1_graph

# Overrides the `mode` fixture: these also run inside XLA (test_xla.py has
# what is particular to XLA).
with_xla = pytest.mark.parametrize("mode", MODES_WITH_XLA)

REDUCTIONS = {
    hvd.Sum: lambda xs, n: xs.sum(0),
    hvd.Average: lambda xs, n: xs.sum(0) / n,
    hvd.Min: lambda xs, n: xs.min(0),
    hvd.Max: lambda xs, n: xs.max(0),
    hvd.Product: lambda xs, n: xs.prod(0),
}


def expected_reduction(op, dtype, size, shape=(3, 4)):
    xs = np.stack([rank_values(r, shape) for r in range(size)]).astype(np.float64)
    out = REDUCTIONS[op](xs, size)
    if op == hvd.Average and dtype.is_integer:
        out = np.trunc(out)  # integer averages truncate, like C division
    return out


@with_xla
def test_allreduce_every_dtype_and_op(mode, rank, size):
    def build():
        return {f"{dt.name}/{op}": hvd.allreduce(tf.constant(rank_values(rank), dtype=dt), op=op)
                for dt in DTYPES for op in REDUCTIONS}
    out = run(mode, build)
    for dt in DTYPES:
        for op in REDUCTIONS:
            assert_close(out[f"{dt.name}/{op}"], expected_reduction(op, dt, size), dt, f"op {op}")


@with_xla
def test_allreduce_bool(mode, rank, size):
    value = np.array([rank == 0, True, False, rank % 2 == 1])

    def build():
        return [hvd.allreduce(tf.constant(value), op=op) for op in (hvd.Sum, hvd.Min, hvd.Max)]
    any_, all_, max_ = run(mode, build)
    everyone = np.stack([[r == 0, True, False, r % 2 == 1] for r in range(size)])
    np.testing.assert_array_equal(any_, everyone.any(0))
    np.testing.assert_array_equal(all_, everyone.all(0))
    np.testing.assert_array_equal(max_, everyone.any(0))


@with_xla
def test_allreduce_scale_factors(mode, rank, size):
    def build():
        return [hvd.allreduce(tf.constant(rank_values(rank), dtype=dt), op=op,
                              prescale_factor=3.0, postscale_factor=0.5)
                for dt in (tf.float32, tf.float64, tf.int32) for op in (hvd.Sum, hvd.Average)]
    out = run(mode, build)
    total = np.stack([rank_values(r) for r in range(size)]).sum(0)
    i = 0
    for dt in (tf.float32, tf.float64, tf.int32):
        for avg in (False, True):
            expected = total * 3 * 0.5 / (size if avg else 1)
            if dt.is_integer:
                expected = np.trunc(np.trunc(total * 3 * 0.5) / (size if avg else 1))
            assert_close(out[i], expected, dt)
            i += 1


def test_allreduce_fp16_compression(rank, size):
    out = hvd.allreduce(tf.constant(rank_values(rank), tf.float32),
                        compression=hvd.Compression.fp16, op=hvd.Sum)
    assert out.dtype == tf.float32
    assert_close(out, expected_reduction(hvd.Sum, tf.float32, size), tf.float16)


@pytest.mark.parametrize("name,big", [("fp16", 60000.0), ("bf16", 2.0e38)])
def test_16bit_compression_divides_before_the_sum(name, big, mode, rank, size):
    """Each rank's value fits the 16-bit type, their sum does not (nor, for
    bf16, float32's); the average does. Multiples of size are exact after
    the division, so their average is bit-exact."""
    compression = getattr(hvd.Compression, name)
    v = np.array([1.0, 0.5, 2.0 ** -10, 384.0], np.float32)

    def build():
        big_avg = hvd.allreduce(tf.fill([3], big), compression=compression)
        exact = hvd.grouped_allreduce([tf.constant(size * (rank + 1) * v)],
                                      compression=compression)
        return big_avg, exact[0]
    big_avg, exact = run(mode, build)
    np.testing.assert_allclose(big_avg, np.full([3], big, np.float32), rtol=1e-2)
    np.testing.assert_array_equal(exact, v * (size * (size + 1) // 2))
    assert exact.dtype == np.float32


def test_many_allreduces_fused_in_one_function(rank, size):
    @tf.function
    def step():
        return [hvd.allreduce(tf.fill([17], float(i + rank)), op=hvd.Sum) for i in range(100)]
    for value in step():
        pass
    out = step()
    for i, value in enumerate(out):
        np.testing.assert_allclose(value.numpy(), np.full([17], size * i + sum(range(size))))


@with_xla
def test_grouped_allreduce_mixed_dtypes(mode, rank, size):
    def build():
        return hvd.grouped_allreduce(
            [tf.constant(rank_values(rank), tf.float32), tf.constant(rank_values(rank), tf.int64),
             tf.constant(rank_values(rank, (5,)), tf.float32)], op=hvd.Sum)
    a, b, c = run(mode, build)
    assert_close(a, expected_reduction(hvd.Sum, tf.float32, size), tf.float32)
    assert_close(b, expected_reduction(hvd.Sum, tf.int64, size), tf.int64)
    assert_close(c, expected_reduction(hvd.Sum, tf.float32, size, (5,)), tf.float32)


def test_unnamed_eager_groups_of_different_sizes_with_the_response_cache(size):
    """Issue 8, item 2: every unnamed eager group is named after the op, so
    member _0 of both groups shares one response-cache entry. From step 1 on,
    the 3-group's _0 missed the cache while _1 and _2 hit, and the group hung
    at np >= 2 (the coordinator waited for members that had run from the
    cache). The sequence runs on a thread so that a hang fails the test."""
    def steps():
        out = []
        for s in range(3):
            one = hvd.grouped_allreduce([tf.ones([5])])
            three = hvd.grouped_allreduce([tf.ones([5])] * 3)
            out.append([t.numpy() for t in one + three])
        return out

    job = Background(steps).wait(120)
    assert job.error is None, job.error
    assert len(job.value) == 3
    for step in job.value:
        for value in step:
            np.testing.assert_array_equal(value, np.ones([5]))


def test_unnamed_eager_group_with_one_member_changing_shape(rank, size):
    """One member of a cached group changes shape every step while the others
    still match their cache entries: the group must still run as one."""
    def steps():
        out = []
        for s in range(4):
            tensors = [tf.fill([2 + s % 2], float(rank + 1)), tf.fill([3], float(rank + s))]
            out.append([t.numpy() for t in hvd.grouped_allreduce(tensors, op=hvd.Sum)])
        return out

    job = Background(steps).wait(120)
    assert job.error is None, job.error
    for s, (first, second) in enumerate(job.value):
        np.testing.assert_array_equal(first, np.full([2 + s % 2], sum(range(1, size + 1))))
        np.testing.assert_array_equal(second, np.full([3], sum(r + s for r in range(size))))


def test_allgather_every_dtype(mode, rank, size):
    def build():
        return {dt.name: hvd.allgather(tf.constant(rank_values(rank, (rank + 1, 2, 3)), dtype=dt))
                for dt in DTYPES + [tf.bool]}
    out = run(mode, build)
    expected = np.concatenate([rank_values(r, (r + 1, 2, 3)) for r in range(size)])
    for dt in DTYPES:
        assert out[dt.name].shape == expected.shape
        assert_close(out[dt.name], expected, dt)
    np.testing.assert_array_equal(out["bool"], expected.astype(bool))


def test_allgather_empty_rank(rank, size):
    rows = 0 if rank == 0 else 2
    out = hvd.allgather(tf.ones([rows, 3]) * rank)
    assert out.shape == (2 * (size - 1), 3)


def test_grouped_allgather(mode, rank, size):
    def build():
        return hvd.grouped_allgather([tf.fill([rank + 1], rank), tf.fill([1, 2], float(rank))])
    a, b = run(mode, build)
    np.testing.assert_array_equal(a, np.concatenate([[r] * (r + 1) for r in range(size)]))
    np.testing.assert_array_equal(b, np.repeat(np.arange(size, dtype=np.float32), 2).reshape(size, 2))


@with_xla
def test_broadcast_every_root_and_dtype(mode, rank, size):
    def build():
        return {f"{dt.name}/{root}": hvd.broadcast(tf.constant(rank_values(rank), dtype=dt), root)
                for dt in DTYPES + [tf.bool] for root in range(size)}
    out = run(mode, build)
    for root in range(size):
        for dt in DTYPES:
            assert_close(out[f"{dt.name}/{root}"], rank_values(root), dt, f"root {root}")
        np.testing.assert_array_equal(out[f"bool/{root}"], rank_values(root).astype(bool))


@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "function"])
def test_broadcast_root_result_is_its_input_buffer(rank, size, in_function):
    """The root's result equals its input bit for bit, so the root gets the
    input's buffer back (shared, as tf.identity's is) rather than a copy,
    even while the caller keeps the input; the other ranks get their own."""
    n = 1 << 18
    x = tf.range(n, dtype=tf.float32) + 1000.0 * rank
    bcast = lambda t: hvd.broadcast(t, 0, name="root_result_is_input")  # noqa: E731
    y = (tf.function(bcast) if in_function else bcast)(x)
    np.testing.assert_array_equal(y.numpy(), np.arange(n, dtype=np.float32))
    # _numpy() exposes the tensor's own buffer (numpy() copies it).
    assert np.shares_memory(x._numpy(), y._numpy()) == (rank == 0)
    # Ops on the shared result leave the input as it was.
    z = y * 2.0 + 1.0
    np.testing.assert_array_equal(z.numpy(), np.arange(n, dtype=np.float32) * 2 + 1)
    np.testing.assert_array_equal(x.numpy(), np.arange(n, dtype=np.float32) + 1000.0 * rank)


def test_large_broadcast_and_allgather(mode, rank, size):
    # Many steps of the shared-memory plane (and past its opt-in single-copy
    # threshold, 2 MB), odd sizes, values that differ by position and rank:
    # a misplaced byte shows.
    n = (3 << 20) // 4 + 5
    rows = (rank + 1) * 300001

    def build():
        out = {f"bcast/{root}": hvd.broadcast(tf.range(n, dtype=tf.float32) + 1e6 * rank, root)
               for root in range(size)}
        out["gather"] = hvd.allgather(
            tf.reshape(tf.range(rows * 2, dtype=tf.int32), [rows, 2]) + 10_000_000 * (rank + 1))
        return out
    out = run(mode, build)
    for root in range(size):
        np.testing.assert_array_equal(out[f"bcast/{root}"],
                                      np.arange(n, dtype=np.float32) + 1e6 * root)
    expected = np.concatenate([
        np.arange((r + 1) * 300001 * 2, dtype=np.int32).reshape(-1, 2) + 10_000_000 * (r + 1)
        for r in range(size)])
    np.testing.assert_array_equal(out["gather"], expected)


def test_alltoall_with_splits(mode, rank, size):
    # Rank r sends (r + j + 1) rows to rank j, each row holding 100 * r + j.
    splits = [rank + j + 1 for j in range(size)]
    rows = np.concatenate([np.full([s, 2], 100 * rank + j) for j, s in enumerate(splits)])

    def build():
        return {dt.name: hvd.alltoall(tf.constant(rows, dt), splits=splits)
                for dt in (tf.int32, tf.float32, tf.float16, tf.int64)}
    out = run(mode, build)
    expected = np.concatenate([np.full([s + rank + 1, 2], 100 * s + rank) for s in range(size)])
    for name, (values, received) in out.items():
        np.testing.assert_array_equal(values, expected, err_msg=name)
        np.testing.assert_array_equal(received, [s + rank + 1 for s in range(size)])


@with_xla
def test_alltoall_even_split(mode, rank, size):
    def build():
        return hvd.alltoall(tf.fill([2 * size, 3], rank))
    out = run(mode, build)
    np.testing.assert_array_equal(out, np.repeat(np.arange(size), 2)[:, None] * np.ones([1, 3]))


@with_xla
def test_reducescatter_uneven_rows(mode, rank, size):
    rows = 2 * size + 1
    value = rank_values(rank, (rows, 2))

    def build():
        return [hvd.reducescatter(tf.constant(value, tf.float32), op=op)
                for op in (hvd.Sum, hvd.Average, hvd.Max)]
    out = run(mode, build)
    # The first (rows mod size) ranks get one extra row.
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    begin = sum(counts[:rank])
    stack = np.stack([rank_values(r, (rows, 2)) for r in range(size)])
    for got, full in zip(out, (stack.sum(0), stack.sum(0) / size, stack.max(0))):
        np.testing.assert_allclose(got, full[begin:begin + counts[rank]], rtol=1e-6)


def test_grouped_reducescatter(rank, size):
    a, b = hvd.grouped_reducescatter([tf.ones([size, 2]) * rank, tf.ones([size])], op=hvd.Sum)
    np.testing.assert_allclose(a.numpy(), np.full([1, 2], sum(range(size))))
    np.testing.assert_allclose(b.numpy(), [size])


def test_indexed_slices_allreduce(rank, size):
    slices = tf.IndexedSlices(tf.ones([1, 2]) * (rank + 1), tf.constant([rank]),
                              dense_shape=tf.constant([size, 2]))
    out = hvd.allreduce(slices)
    assert isinstance(out, tf.IndexedSlices)
    dense = tf.convert_to_tensor(out).numpy()
    np.testing.assert_allclose(dense, np.arange(1, size + 1)[:, None] / size * np.ones([1, 2]))
    with pytest.raises(NotImplementedError):
        hvd.allreduce(slices, op=hvd.Max)


def test_barrier_and_named_collectives(rank, size):
    hvd.barrier()
    # Explicit names key eager collectives, so submission order may differ by rank.
    import threading
    results = {}

    def reduce(name):
        results[name] = hvd.allreduce(tf.constant(float(rank)), name=name, op=hvd.Sum).numpy()
    names = ["first", "second"] if rank % 2 == 0 else ["second", "first"]
    threads = [threading.Thread(target=reduce, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {"first": sum(range(size)), "second": sum(range(size))}


def test_eager_names_past_the_key_table_still_key_their_collectives(rank, size, monkeypatch):
    # Eager collectives keep one key tensor per name (op_calls._eager_key);
    # a script that makes names without end only refills the table.
    from tfring.tensorflow import op_calls
    monkeypatch.setattr(op_calls, "_EAGER_KEYS_MAX", 3)
    op_calls._EAGER_KEYS.clear()
    for i in range(7):
        got = hvd.allreduce(tf.constant([float(rank + i)]), name=f"named.{i}", op=hvd.Sum)
        assert got.numpy()[0] == sum(range(size)) + size * i
        assert len(op_calls._EAGER_KEYS) <= 3
    assert op_calls._eager_key("named.6") is op_calls._eager_key("named.6")
    op_calls._EAGER_KEYS.clear()


def test_join_counts_joined_ranks_as_zeros(rank, size):
    # Rank r runs r + 1 steps, then joins: step i sums over ranks still working.
    for i in range(rank + 1):
        out = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name=f"join_step_{i}").numpy()
        np.testing.assert_allclose(out, [size - i] * 2)
    assert hvd.join() == size - 1
    # After everyone joined, collectives work as usual.
    assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy() == size


@with_xla
def test_broadcast_in_a_set_uses_the_job_wide_root(mode, rank, size, set_without_rank_0):
    """Horovod's root_rank is a job-wide rank, also in a process set: with the
    set [1, 2], root_rank=1 sends global rank 1's value (set rank 0)."""
    ps = set_without_rank_0
    if not ps.included():
        return
    def build():
        return {root: hvd.broadcast(tf.constant(rank_values(rank), tf.int32), root,
                                    process_set=ps)
                for root in ps.ranks}
    out = run(mode, build)
    for root in ps.ranks:
        np.testing.assert_array_equal(out[root], rank_values(root), err_msg=f"root {root}")


def test_broadcast_helpers_in_a_set_use_the_job_wide_root(rank, size, set_without_rank_0):
    ps = set_without_rank_0
    if not ps.included():
        return
    for root in ps.ranks:
        a = tf.Variable(tf.fill([3], float(rank)))
        b = tf.Variable(tf.fill([2], rank))
        hvd.broadcast_variables([a, b], root_rank=root, process_set=ps)
        np.testing.assert_array_equal(a.numpy(), [root] * 3)
        np.testing.assert_array_equal(b.numpy(), [root] * 2)
        c = tf.Variable(tf.fill([4], rank + 0.5))
        hvd.broadcast_variables([c], root_rank=root, process_set=ps, inplace=True)
        np.testing.assert_array_equal(c.numpy(), [root + 0.5] * 4)
        d = tf.Variable(tf.fill([2], -rank))
        hvd.broadcast_([d], root_rank=root, process_set=ps)
        np.testing.assert_array_equal(d.numpy(), [-root] * 2)
        assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=ps) == \
            {"from": root}
        assert hvd.broadcast_object_fn(root_rank=root, process_set=ps)(rank * 2) == root * 2


def test_broadcast_variables_and_inplace(rank, size):
    a = tf.Variable(tf.fill([3], float(rank)))
    b = tf.Variable(tf.fill([2, 2], rank), dtype=tf.int32)
    hvd.broadcast_variables([a, b], root_rank=size - 1)
    np.testing.assert_allclose(a.numpy(), [size - 1] * 3)
    np.testing.assert_array_equal(b.numpy(), np.full([2, 2], size - 1))
    c = tf.Variable(tf.fill([4], float(rank) + 0.5))
    hvd.broadcast_([c], root_rank=0)
    np.testing.assert_allclose(c.numpy(), [0.5] * 4)


@pytest.mark.parametrize("inplace", [False, True], ids=["assign", "inplace"])
def test_broadcast_tf1_reference_variables(rank, size, inplace):
    # tf.compat.v1.Variable in a graph with resource variables disabled is a
    # RefVariable, which has no resource handle.
    with tf1_graph(resource_variables=False):
        a = tf.compat.v1.Variable(tf.fill([3], float(rank)))
        b = tf.compat.v1.get_variable("b", initializer=tf.fill([2, 2], rank))
        assert not hasattr(a, "handle") and not hasattr(b, "handle")
        bcast = hvd.broadcast_variables([a, b], root_rank=size - 1, inplace=inplace)
        values = hvd.broadcast_([a], root_rank=0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            np.testing.assert_allclose(sess.run(a), [size - 1] * 3)
            np.testing.assert_array_equal(sess.run(b), np.full([2, 2], size - 1))
            sess.run(a.assign(tf.fill([3], float(rank) + 0.5)))
            # broadcast_ returns the values after the broadcast (Horovod's contract).
            np.testing.assert_allclose(sess.run(values)[0], [0.5] * 3)
            np.testing.assert_allclose(sess.run(a), [0.5] * 3)


def test_broadcast_inplace_resource_variables_in_tf1_graph(rank, size):
    with tf1_graph():
        a = tf.compat.v1.Variable(tf.fill([3], float(rank)))
        assert hasattr(a, "handle")
        bcast = hvd.broadcast_variables([a], root_rank=size - 1, inplace=True)
        values = hvd.broadcast_([a], root_rank=0)
        with tf.compat.v1.Session() as sess:
            sess.run(a.initializer)
            sess.run(bcast)
            np.testing.assert_allclose(sess.run(a), [size - 1] * 3)
            sess.run(a.assign(tf.fill([3], float(rank) + 0.5)))
            np.testing.assert_allclose(sess.run(values)[0], [0.5] * 3)


def test_broadcast_and_allgather_objects(rank, size):
    obj = {"rank": rank, "data": list(range(rank))} if rank == 0 else None
    assert hvd.broadcast_object(obj, root_rank=0) == {"rank": 0, "data": []}
    assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
    fn = hvd.broadcast_object_fn(root_rank=size - 1)
    assert fn(rank * 2) == (size - 1) * 2


def test_object_collectives_in_a_tf1_graph(rank, size):
    obj = {"rank": rank} if rank == size - 1 else None
    # Horovod's form: no session= and no name=, the default session runs them.
    with tf1_graph(), tf.compat.v1.Session():
        assert hvd.broadcast_object(obj, root_rank=size - 1) == {"rank": size - 1}
        assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
        assert hvd.broadcast_object_fn(root_rank=0)(rank + 7) == 7
    # The explicit form.
    with tf1_graph(), tf.compat.v1.Session() as sess:
        assert hvd.broadcast_object(obj, root_rank=size - 1, session=sess,
                                    name="graph_obj") == {"rank": size - 1}
        assert hvd.allgather_object(rank, session=sess, name="graph_gather") == list(range(size))
        fn = hvd.broadcast_object_fn(root_rank=0, session=sess, name="graph_fn")
        assert fn(rank + 7) == 7
    # Neither: a clear error on every rank, before anything is sent.
    with tf1_graph():
        for call in (lambda: hvd.broadcast_object(obj, root_rank=0),
                     lambda: hvd.allgather_object(rank),
                     lambda: hvd.broadcast_object_fn(root_rank=0)(rank)):
            with pytest.raises(RuntimeError, match="need a session to run in"):
                call()
    assert hvd.allgather_object(rank) == list(range(size))


def test_process_sets(rank, size):
    evens = hvd.add_process_set(list(range(0, size, 2)))
    last = hvd.add_process_set([size - 1])
    try:
        assert evens.size() == len(range(0, size, 2))
        assert evens.included() == (rank % 2 == 0)
        if evens.included():
            out = hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum, process_set=evens)
            assert out.numpy() == sum(range(0, size, 2))
            assert hvd.allgather(tf.constant([rank]), process_set=evens).numpy().tolist() == \
                list(range(0, size, 2))
        else:
            with pytest.raises(tf.errors.InvalidArgumentError, match="not a member"):
                hvd.allreduce(tf.constant(1.0), process_set=evens)
        if last.included():
            assert last.rank() == 0
            # root_rank is job-wide, as in Horovod: the set's only member.
            assert hvd.broadcast(tf.constant(7), size - 1, process_set=last).numpy() == 7
        # The global set keeps working alongside.
        assert hvd.allreduce(tf.constant(1.0), op=hvd.Sum).numpy() == size
    finally:
        assert hvd.remove_process_set(evens)
        assert hvd.remove_process_set(last)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(tf.constant(1.0), process_set=evens)


def test_topology(rank, size):
    import os
    # The launcher's numbering: MPI's PMI_* under mpiexec, TFRING_* under --tcp.
    assert rank == int(os.environ.get("TFRING_RANK", os.environ.get("PMI_RANK", 0)))
    assert size == int(os.environ.get("TFRING_SIZE", os.environ.get("PMI_SIZE", 1)))
    assert hvd.local_rank() == rank and hvd.local_size() == size  # one host
    assert hvd.cross_rank() == 0 and hvd.cross_size() == 1
    assert hvd.is_homogeneous() and hvd.is_initialized()
    # Exactly one controller runs: the one the environment names.
    from tfring.common import basics
    tcp = basics.configured_controller() == "tcp"
    assert hvd.gloo_enabled() is tcp and hvd.mpi_enabled() is (not tcp)
    values = run("graph", lambda: [hvd.rank_op(), hvd.size_op(), hvd.local_rank_op(),
                                   hvd.local_size_op(), hvd.process_set_included_op()])
    assert list(values) == [rank, size, rank, size, 1]


def test_build_queries_tell_the_truth():
    from tfring.common import loader
    core = loader.load()[1]
    mpi_flag = getattr(core, "mpi_built", True)
    assert hvd.mpi_built() is bool(mpi_flag() if callable(mpi_flag) else mpi_flag)
    assert hvd.gloo_built() is hasattr(core, "init_tcp")
    assert hvd.nccl_built() is bool(core.nccl_built)
    # CUDA is only ever built in for NCCL.
    assert hvd.cuda_built() is hvd.nccl_built()
    for absent in (hvd.rocm_built, hvd.ccl_built, hvd.ddl_built):
        assert absent() is False, absent.__name__
