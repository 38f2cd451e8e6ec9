"""One rank of the GPU checks through ``tfring.core`` with CuPy arrays.

Run under ``tfringrun --tcp -np N python core_worker.py CHECK``. Every rank
prints ``RESULT <json>`` lines that the tests in this folder read; a check
that fails raises, so the rank exits non-zero and tfringrun reports it.

Checks:
  collectives  every collective x dtype x op x scale factors, fused groups,
               a ready event on a side stream, a steady loop speculated and
               launched on submit (and a shape mismatch inside it), waits
               that complete by event (at np=1: the host returns while the
               stream is still busy); at np=1 also that no tensor left the
               GPU (the host-staging copy counter stays 0)
  hierarchical allreduce x dtype x op x scale factors with fake hosts and
               TFRING_HIERARCHICAL_ALLREDUCE=1: NCCL within each host, the
               host ring across them
  kill         rank 1 dies while the others wait in a GPU collective: each
               survivor's error names it
  train        plain SGD on a small MLP (CuPy), averaged gradients, against
               the single-process reference computed on every rank
"""
import json
import os
import sys
import time

import numpy as np
import cupy as cp

import tfring.core as hvd

DTYPES = ["float16", "float32", "float64", "int32", "int64", "uint8"]
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}
SCALES = [(1.0, 1.0), (0.5, 3.0), (1.5, 0.25)]
# Within one rounding step of the host arithmetic (the GPU scales in the
# dtype's own precision, the CPU in double rounded once).
RTOL = {"float16": 2e-3, "float32": 2e-7, "float64": 1e-15}


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def values(dtype, n, rank, seed=0):
    """Rank `rank`'s input: small integers, exact in every dtype; positive
    and small for uint8 and Product so that nothing overflows."""
    i = np.arange(n, dtype=np.int64)
    if dtype == "uint8":
        x = (i * 7 + rank * 3 + seed) % 5 + 1
    else:
        x = ((i * 7 + rank * 13 + seed * 5) % 9) - 4
        x[x == 0] = 1
    return x.astype(dtype)


def expected(dtype, n, size, op, pre, post, seed=0):
    """The reduction of every rank's input, prescaled and postscaled, in
    float64 (rounded to `dtype` at the end)."""
    xs = [values(dtype, n, r, seed).astype(np.float64) for r in range(size)]
    integer = np.issubdtype(np.dtype(dtype), np.integer)
    if integer:
        xs = [np.trunc(x * pre) for x in xs]
    else:
        xs = [x * pre for x in xs]
    stacked = np.stack(xs)
    if op in ("Sum", "Average"):
        y = stacked.sum(axis=0)
    elif op == "Min":
        y = stacked.min(axis=0)
    elif op == "Max":
        y = stacked.max(axis=0)
    else:
        y = stacked.prod(axis=0)
    y = y * post
    if integer:
        y = np.trunc(y)
        if op == "Average":
            y = np.trunc(y / size)
    elif op == "Average":
        y = y / size
    return y


def check_close(got, want, dtype, what):
    got = np.asarray(got, dtype=np.float64)
    if dtype in RTOL:
        ok = np.allclose(got, want, rtol=RTOL[dtype] * 4, atol=0)
        worst = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))
    else:
        ok = np.array_equal(got, want)
        worst = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not ok:
        bad = np.flatnonzero(~np.isclose(got, want, rtol=RTOL.get(dtype, 0) * 4, atol=0))
        raise AssertionError(f"{what}: {bad.size} of {got.size} elements differ, e.g. "
                             f"[{bad[0]}] got {got[bad[0]]} want {want[bad[0]]}")
    return worst


def check_allreduces(dtype, opname, n, worst):
    """Allreduce of `n` elements with every pair of scale factors; returns
    the number of checks and keeps each dtype's worst relative error."""
    rank, size = hvd.rank(), hvd.size()
    checks = 0
    for pre, post in SCALES:
        if dtype == "uint8" and (pre, post) != (1.0, 1.0):
            continue
        x = cp.asarray(values(dtype, n, rank))
        y = hvd.allreduce(x, op=OPS[opname], prescale_factor=pre, postscale_factor=post,
                          name=f"ar.{n}.{dtype}.{opname}.{pre}.{post}")
        assert isinstance(y, cp.ndarray) and y.dtype == x.dtype and y.shape == x.shape
        want = expected(dtype, n, size, opname, pre, post)
        w = check_close(cp.asnumpy(y), want, dtype, f"allreduce of {n} {opname} {dtype} "
                        f"pre {pre} post {post}")
        worst[dtype] = max(worst.get(dtype, 0.0), w)
        assert cp.array_equal(x, cp.asarray(values(dtype, n, rank))), "input changed"
        checks += 1
    return checks


def check_hierarchical():
    """Allreduce only (the hierarchical plane's own collective; the others
    take NCCL over the whole set, which one GPU cannot hold for two ranks):
    every dtype x op x scale pair, at sizes that give each rank an empty,
    an uneven and a large share, and a fused group."""
    rank, size = hvd.rank(), hvd.size()
    cp.cuda.Device(0).use()
    copies_before = hvd.host_staging_copies()
    checks, worst = 0, {}
    for n in (1, 1001):
        for dtype in DTYPES:
            for opname in OPS:
                checks += check_allreduces(dtype, opname, n, worst)
    for opname in ("Sum", "Average"):
        checks += check_allreduces("float32", opname, 4 << 20, worst)  # 16 MB
    xs = [cp.asarray(values("float32", c, rank, seed=i)) for i, c in enumerate([3, 1000, 4097])]
    ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name="group.hierarchical")
    for i, (c, y) in enumerate(zip([3, 1000, 4097], ys)):
        check_close(cp.asnumpy(y), expected("float32", c, size, "Sum", 1.0, 1.0, seed=i),
                    "float32", f"grouped allreduce tensor {i}")
    checks += 1
    report(rank=rank, size=size, check="hierarchical", checks=checks,
           host_copies=hvd.host_staging_copies() - copies_before, worst_relative_error=worst)


def check_collectives():
    rank, size = hvd.rank(), hvd.size()
    cp.cuda.Device(hvd.local_rank() % cp.cuda.runtime.getDeviceCount()).use()
    copies_before = hvd.host_staging_copies()
    checks, worst = 0, {}
    n = 1001
    for dtype in DTYPES:
        for opname, op in OPS.items():
            checks += check_allreduces(dtype, opname, n, worst)
            # reducescatter: rank r keeps its share of the first dimension.
            rows = 2 * size + 1
            xs = cp.asarray(values(dtype, rows * 3, rank).reshape(rows, 3))
            got = hvd.reducescatter(xs, op=op, name=f"rs.{dtype}.{opname}")
            full = expected(dtype, rows * 3, size, opname, 1.0, 1.0).reshape(rows, 3)
            starts = np.cumsum([0] + [rows // size + (1 if r < rows % size else 0)
                                      for r in range(size)])
            check_close(cp.asnumpy(got), full[starts[rank]:starts[rank + 1]], dtype,
                        f"reducescatter {opname} {dtype}")
            checks += 1
        # Allgather with a ragged first dimension.
        mine = cp.asarray(values(dtype, (rank + 1) * 4, rank).reshape(rank + 1, 4))
        got = cp.asnumpy(hvd.allgather(mine, name=f"ag.{dtype}"))
        want = np.concatenate([values(dtype, (r + 1) * 4, r).reshape(r + 1, 4)
                               for r in range(size)])
        assert np.array_equal(got, want), f"allgather {dtype}"
        # Broadcast from the last rank.
        root = size - 1
        got = cp.asnumpy(hvd.broadcast(cp.asarray(values(dtype, 77, rank)), root_rank=root,
                                       name=f"bc.{dtype}"))
        assert np.array_equal(got, values(dtype, 77, root)), f"broadcast {dtype}"
        # Alltoall with uneven splits: rank r sends j+1 rows to rank j.
        splits = [j + 1 for j in range(size)]
        send = values(dtype, sum(splits) * 2, rank).reshape(sum(splits), 2)
        out, received = hvd.alltoall(cp.asarray(send), splits=splits, name=f"a2a.{dtype}")
        received = [int(v) for v in np.asarray(received)]
        assert received == [rank + 1] * size, f"alltoall splits {received}"
        want = np.concatenate([
            values(dtype, sum(splits) * 2, r).reshape(sum(splits), 2)[sum(splits[:rank]):
                                                                     sum(splits[:rank + 1])]
            for r in range(size)])
        assert np.array_equal(cp.asnumpy(out), want), f"alltoall {dtype}"
        checks += 3
    # Fused: many small tensors of several sizes in one group.
    for dtype in ("float16", "float32", "int64"):
        xs = [cp.asarray(values(dtype, c, rank, seed=i))
              for i, c in enumerate([1, 3, 1000, 4097, 64])]
        ys = hvd.grouped_allreduce(xs, op=hvd.Sum, name=f"group.{dtype}")
        for i, (c, y) in enumerate(zip([1, 3, 1000, 4097, 64], ys)):
            check_close(cp.asnumpy(y), expected(dtype, c, size, "Sum", 1.0, 1.0, seed=i), dtype,
                        f"grouped allreduce {dtype} tensor {i}")
        checks += 1
    # A ready event on a side stream: the input is still being written by a
    # kernel on another stream when it is handed over.
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        big = cp.zeros(64 << 20, dtype=cp.float32)   # 256 MB
        big += 1.0                                   # queued on `side`
        for _ in range(20):
            big *= 1.0
        y = hvd.allreduce(big, op=hvd.Sum, name="side.stream")
        # Read on `side`, which the wait made wait for the collective
        # (complete by event); another stream would need a sync first.
        assert float(cp.asnumpy(y[:1000]).min()) == float(size), "ready event not honoured"
        assert float(cp.asnumpy(y[-1000:]).max()) == float(size), "ready event not honoured"
    checks += 1
    # Tensors that two streams are still writing, each handed over on its
    # own stream, and likely fused into one collective: it must wait for
    # both streams (once each, for the latest event of each), and a group
    # (one event for all its tensors) for its one stream.
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    handles, parts = [], []
    for k in range(6):
        with streams[k % 2]:
            part = cp.zeros(1 << 20, dtype=cp.float32)  # 4 MB each
            for _ in range(10):
                part += 1.0
            parts.append(part)
            handles.append(hvd.allreduce_async(part, op=hvd.Sum, name=f"two.streams.{k}"))
    with streams[0]:
        group = [cp.full(1 << 20, 2.0, dtype=cp.float32) for _ in range(3)]
        for g in group:
            g *= 1.5
        ys = hvd.grouped_allreduce(group, op=hvd.Sum, name="group.side.stream")
        for k, y in enumerate(ys):
            got = cp.asnumpy(y)
            assert got.min() == got.max() == 3.0 * size, \
                f"group tensor {k}: ready event not honoured"
    # synchronize() on the default stream makes that one wait.
    for k, h in enumerate(handles):
        got = cp.asnumpy(hvd.synchronize(h))
        assert got.min() == got.max() == 10.0 * size, f"tensor {k}: ready events not honoured"
    checks += 1
    # The one-call path (submit_device) takes CuPy arrays, in place or not.
    from tfring.core import ops
    x = cp.full(1000, float(rank + 1), dtype=cp.float32)
    h = hvd.allreduce_async(x, op=hvd.Sum, name="one.call")
    assert isinstance(h, ops._ArrayHandle), "a CuPy allreduce went the general way"
    total = size * (size + 1) / 2
    assert float(h.wait()[0]) == total
    assert hvd.allreduce_(x, op=hvd.Sum, name="one.call.in.place") is x
    assert float(x.min()) == float(x.max()) == total
    checks += 1
    spec = check_launch_on_submit(rank, size)
    checks += 1
    by_event = check_complete_by_event(rank, size)
    checks += 1
    copies = hvd.host_staging_copies() - copies_before
    report(rank=rank, size=size, check="collectives", checks=checks, host_copies=copies,
           speculation=spec, by_event=by_event,
           worst_relative_error=worst, gpu=cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
           nccl_built=hvd.nccl_built())


def check_launch_on_submit(rank, size):
    """A steady loop of GPU allreduces of one name enters speculation (no
    negotiation round per call) and is launched by the submitting thread;
    each result is right. Then one rank changes the shape: every rank gets
    the typed mismatch error, and the next collective works. Returns the
    loop's speculation counters."""
    from tfring.core import _module

    def _speculation_stats():
        # tfring.core's own module (tfring.common.basics reads the TF op
        # library's, which this machine does not have).
        return dict(_module.load().speculation_stats())
    before = _speculation_stats()
    x = cp.empty(4096, dtype=cp.float32)
    for step in range(60):
        x.fill(float(rank + 1 + step))
        y = hvd.allreduce(x, op=hvd.Sum, name="steady.gpu")
        want = size * (size + 1) / 2 + size * step
        got = cp.asnumpy(y)
        assert got.min() == got.max() == want, f"step {step}: {got[:4]} != {want}"
    after = _speculation_stats()
    spec = {k: after[k] - before[k] for k in after}
    assert spec["responses"] > 0, f"GPU allreduces were never speculated: {spec}"
    if size == 1:
        assert spec["inline"] > 0, f"no GPU allreduce was launched on submit: {spec}"
    if size > 1:
        bad = cp.ones(4096 + (rank == size - 1), dtype=cp.float32)
        try:
            hvd.allreduce(bad, op=hvd.Sum, name="steady.gpu")
        except hvd.PreconditionError as e:
            assert "Mismatched" in str(e) and "steady.gpu" in str(e), str(e)
        else:
            raise AssertionError("a shape changed on one rank during speculation was not refused")
        y = hvd.allreduce(cp.ones(8, dtype=cp.float32), op=hvd.Sum, name="after.mismatch")
        assert float(cp.asnumpy(y).min()) == size
    return spec


# Keeps one GPU thread busy for `cycles` clock cycles.
SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
"""


def check_complete_by_event(rank, size):
    """Complete by event: behind a kernel that keeps the caller's stream
    busy (0.3 s or more), a collective's wait returns with the stream still
    busy (the host never waited for the device), through the one-call path
    and the general one, and what the stream runs next reads the results.
    With NCCL only (np=1): host staging copies through the host, which waits."""
    stream = cp.cuda.get_current_stream()
    spin = cp.RawKernel(SPIN, "spin")
    x = cp.full(1 << 20, float(rank + 1), dtype=cp.float32)
    stream.synchronize()
    spin((1,), (1,), (np.int64(6e8),))  # 0.3 s at 2 GHz, longer at lower clocks
    start = time.perf_counter()
    y = hvd.allreduce(x, op=hvd.Sum, name="by.event.one.call")
    a, b = hvd.grouped_allreduce_async([x, x], op=hvd.Sum, name="by.event.group").wait()
    waited = time.perf_counter() - start
    busy = not stream.done
    total = size * (size + 1) / 2
    for got, what in ((y, "one call"), (a, "group"), (b, "group")):
        got = cp.asnumpy(got)  # on `stream`: after the collective
        assert got.min() == got.max() == total, f"{what}: {got[:4]} != {total}"
    if size == 1 and hvd.nccl_built():
        assert busy, f"the waits took {waited:.3f} s and the stream was idle: the host waited"
    return {"waited_s": round(waited, 4), "stream_busy_after_wait": busy}


def check_kill():
    rank = hvd.rank()
    x = cp.ones(1 << 20, dtype=cp.float32)
    hvd.allreduce(x, name="before")  # everyone is up
    if rank == 1:
        os._exit(17)  # dies without a word: no shutdown, no goodbye
    start = time.monotonic()
    try:
        hvd.allreduce(x, name="after")
    except Exception as e:  # noqa: BLE001 - the type is reported and checked by the test
        report(rank=rank, check="kill", error_type=type(e).__name__,
               error_mro=[c.__name__ for c in type(e).__mro__], message=str(e),
               seconds=time.monotonic() - start)
        return
    raise AssertionError("the collective with a dead peer returned normally")


def mlp_step(params, x, y):
    """Loss gradients of a 2-layer tanh MLP with squared error (CuPy)."""
    w1, b1, w2, b2 = params
    h = cp.tanh(x @ w1 + b1)
    out = h @ w2 + b2
    d_out = 2.0 * (out - y) / x.shape[0]
    g_w2 = h.T @ d_out
    g_b2 = d_out.sum(axis=0)
    d_h = (d_out @ w2.T) * (1 - h * h)
    g_w1 = x.T @ d_h
    g_b1 = d_h.sum(axis=0)
    return [g_w1, g_b1, g_w2, g_b2]


def check_train():
    rank, size = hvd.rank(), hvd.size()
    rng = np.random.default_rng(7)
    data_x = rng.standard_normal((64, 8))
    data_y = rng.standard_normal((64, 2))
    init = [rng.standard_normal((8, 16)) * 0.3, np.zeros(16), rng.standard_normal((16, 2)) * 0.3,
            np.zeros(2)]
    lr, steps = 0.1, 20
    # Every rank starts from rank 0's parameters (broadcast), trains on its
    # shard, and averages the gradients.
    params = [hvd.broadcast(cp.asarray(p + rank), root_rank=0, name=f"init.{i}")
              for i, p in enumerate(init)]
    shard = slice(rank * 64 // size, (rank + 1) * 64 // size)
    for step in range(steps):
        grads = mlp_step(params, cp.asarray(data_x[shard]), cp.asarray(data_y[shard]))
        grads = hvd.grouped_allreduce(grads, op=hvd.Average, name=f"grads.{step}")
        params = [p - lr * g for p, g in zip(params, grads)]
    # The single-process reference: the full batch, where the average of the
    # shards' mean gradients equals the full batch's (equal shards).
    ref = [cp.asarray(p) for p in init]
    for step in range(steps):
        grads = mlp_step(ref, cp.asarray(data_x), cp.asarray(data_y))
        ref = [p - lr * g for p, g in zip(ref, grads)]
    diff = max(float(cp.max(cp.abs(p - r))) for p, r in zip(params, ref))
    assert diff < 1e-10, f"trained parameters differ from the reference by {diff}"
    report(rank=rank, size=size, check="train", max_abs_diff=diff)


if __name__ == "__main__":
    hvd.init()
    try:
        {"collectives": check_collectives, "hierarchical": check_hierarchical,
         "kill": check_kill, "train": check_train}[sys.argv[1]]()
    finally:
        if not (sys.argv[1] == "kill"):
            hvd.shutdown()
