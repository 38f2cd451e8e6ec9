"""Soak: many random collectives, each checked against numpy, with RSS tracked.

    tfringrun -np N python tests/common/soak_worker.py [--count C] [--seed S]

Every rank draws the same sequence of steps from one seeded generator (so
all of them submit the same collectives in the same order): the collective
(allreduce with Sum/Average/Min/Max, allgather, broadcast, alltoall,
reducescatter, grouped_allreduce), dtype, shape (1 element to ~64 KB, now and
then ~1 MB) and mode (eager, or one of a small fixed set of tf.functions).
Inputs depend on the rank; every rank can compute every rank's input for a
step, so it checks its own result exactly (or, for floating-point averages,
to the dtype's precision).

RSS (/proc/self/statm) is read after a warm-up (which also runs every
tf.function and every eager kernel a step can use once) and at the end. Each rank prints one summary line:

    SOAK rank=R count=C seconds=S rate=X rss_warm_mb=A rss_end_mb=B failures=F

and MISMATCH lines for the first few failures. The count defaults to
$TFRING_SOAK_COUNT, else 2000. Exits 1 if any check failed.
"""
import argparse
import math
import os
import time

import numpy as np
import tensorflow as tf

import tfring.tensorflow as hvd

ALL_DTYPES = [tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.int8,
              tf.uint8, tf.int16, tf.uint16, tf.bool]
FUNCTION_DTYPES = [tf.float32, tf.int32]  # tf.function steps: a small, fixed set of traces
REDUCE_OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max]
OP_NAMES = {hvd.Sum: "Sum", hvd.Average: "Average", hvd.Min: "Min", hvd.Max: "Max"}
KINDS = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "grouped_allreduce"]
SMALL_BYTES = 64 * 1024
LARGE_BYTES = 1024 * 1024
LARGE_CHANCE = 0.02
NAMED = 0.3  # eager steps: the share that pass name= (the same name per kind each time)
MAX_REPORTED = 10


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# -- inputs ----------------------------------------------------------------------------

def np_dtype(dtype):
    return dtype.as_numpy_dtype


def rank_input(seed, step, rank, slot, shape, dtype):
    """Rank `rank`'s input for tensor `slot` of step `step`: small integers, so
    that sums, minima and maxima are exact in every dtype (also float16 and
    bfloat16, and unsigned ones)."""
    gen = np.random.default_rng([seed, step, rank, slot])
    if dtype == tf.bool:
        return gen.random(shape) < 0.5
    low = 0 if dtype in (tf.uint8, tf.uint16) else -8
    return gen.integers(low, 9, size=shape).astype(np_dtype(dtype))


def reduce_np(arrays, op, dtype, size):
    """What tfring's reduction gives, computed in numpy."""
    if dtype == tf.bool:
        stack = np.stack(arrays)
        return stack.any(0) if op in (hvd.Sum, hvd.Max) else stack.all(0)
    wide = np.stack([a.astype(np.float64 if dtype.is_floating else np.int64) for a in arrays])
    if op == hvd.Min:
        out = wide.min(0)
    elif op == hvd.Max:
        out = wide.max(0)
    else:
        out = wide.sum(0)
        if op == hvd.Average:
            # Integers truncate toward zero, like C division.
            out = out / size if dtype.is_floating else np.sign(out) * (np.abs(out) // size)
    return out


def close(got, want, dtype, op):
    got = np.asarray(got)
    if got.shape != np.shape(want):
        return False
    if dtype == tf.bool:
        return np.array_equal(got.astype(bool), want)
    got = got.astype(np.float64)
    if dtype.is_floating and op == hvd.Average:
        tol = {tf.float16: 2e-3, tf.bfloat16: 1e-2, tf.float32: 1e-6, tf.float64: 1e-12}[dtype]
        return np.allclose(got, want, rtol=tol, atol=tol)
    return np.array_equal(got, want)


# -- the random plan ---------------------------------------------------------------------

def draw_shape(gen, dtype, max_bytes=None):
    """A random shape: ~log-uniform element count up to 64 KB, sometimes ~1 MB."""
    itemsize = np.dtype(np_dtype(dtype)).itemsize
    if max_bytes is None:
        max_bytes = LARGE_BYTES if gen.random() < LARGE_CHANCE else SMALL_BYTES
    max_elems = max(1, max_bytes // itemsize)
    n = int(math.exp(gen.uniform(0, math.log(max_elems)))) if max_elems > 1 else 1
    cols = int(gen.choice([1, 3, 16, 64]))
    if gen.random() < 0.15 or cols > n:
        return [n]
    return [max(1, n // cols), cols]


def draw_step(gen, size):
    """One step's plan; every rank draws the same."""
    kind = KINDS[gen.integers(len(KINDS))]
    function = gen.random() < 0.5
    dtypes = FUNCTION_DTYPES if function else ALL_DTYPES
    dtype = dtypes[gen.integers(len(dtypes))]
    # Some eager steps pass a name (one per kind, as training steps reuse
    # theirs); grouped allreduces go unnamed. The memory cost of ever-new
    # names is measured on its own (--distinct-names).
    named = not function and kind != "grouped_allreduce" and gen.random() < NAMED
    plan = {"kind": kind, "function": function, "dtype": dtype,
            "name": f"soak_{kind}" if named else None}
    if kind in ("allreduce", "reducescatter", "grouped_allreduce"):
        ops = [op for op in REDUCE_OPS if not (dtype == tf.bool and op == hvd.Average)]
        plan["op"] = ops[gen.integers(len(ops))]
    shape = draw_shape(gen, dtype)
    cols = shape[1:]
    max_rows = shape[0]
    if kind == "allreduce":
        plan["shapes"] = [shape]
    elif kind == "broadcast":
        plan["shapes"] = [shape]
        plan["root"] = int(gen.integers(size))
    elif kind == "allgather":
        # Each rank its own number of rows (sometimes none).
        plan["rows"] = [int(gen.integers(0, max_rows + 1)) if gen.random() < 0.9 else 0
                        for _ in range(size)]
        plan["cols"] = cols
    elif kind == "alltoall":
        if gen.random() < 0.2:
            per = max(1, max_rows // size)
            plan["splits"] = None
            plan["matrix"] = [[per] * size for _ in range(size)]
        else:
            top = max(1, max_rows // size)
            plan["splits"] = True
            plan["matrix"] = [[int(gen.integers(0, top + 1)) for _ in range(size)]
                              for _ in range(size)]
        plan["cols"] = cols
    elif kind == "reducescatter":
        plan["shapes"] = [[max(1, max_rows)] + cols]
    elif kind == "grouped_allreduce":
        count = int(gen.choice([2, 3])) if function else int(gen.integers(1, 5))
        if function or gen.random() < 0.7:
            member_dtypes = [dtype] * count
        else:  # mixed dtypes: one request per dtype
            usable = [d for d in ALL_DTYPES if d != tf.bool or plan["op"] != hvd.Average]
            member_dtypes = [usable[gen.integers(len(usable))] for _ in range(count)]
        plan["dtypes"] = member_dtypes
        plan["shapes"] = [draw_shape(gen, d, max_bytes=SMALL_BYTES) for d in member_dtypes]
    return plan


# -- running a step ----------------------------------------------------------------------

class Functions:
    """The fixed set of tf.functions steps may use, each traced once."""

    def __init__(self, size):
        self.size = size
        self.cache = {}

    def get(self, kind, dtype, op=None, root=None, count=None):
        key = (kind, dtype.name, op, root, count)
        if key not in self.cache:
            self.cache[key] = self._make(kind, dtype, op, root, count)
        return self.cache[key]

    def _make(self, kind, dtype, op, root, count):
        x = tf.TensorSpec(None, dtype)
        if kind == "allreduce":
            return tf.function(lambda t: hvd.allreduce(t, op=op), input_signature=[x])
        if kind == "allgather":
            return tf.function(lambda t: hvd.allgather(t), input_signature=[x])
        if kind == "broadcast":
            return tf.function(lambda t: hvd.broadcast(t, root_rank=root), input_signature=[x])
        if kind == "alltoall":
            return tf.function(lambda t, s: hvd.alltoall(t, splits=s),
                               input_signature=[x, tf.TensorSpec([None], tf.int32)])
        if kind == "reducescatter":
            return tf.function(lambda t: hvd.reducescatter(t, op=op), input_signature=[x])
        if kind == "grouped_allreduce":
            return tf.function(lambda *ts: hvd.grouped_allreduce(list(ts), op=op),
                               input_signature=[x] * count)
        raise ValueError(kind)

    def all_keys(self):
        for dtype in FUNCTION_DTYPES:
            for op in REDUCE_OPS:
                yield ("allreduce", dtype, op, None, None)
                yield ("reducescatter", dtype, op, None, None)
                for count in (2, 3):
                    yield ("grouped_allreduce", dtype, op, None, count)
            yield ("allgather", dtype, None, None, None)
            yield ("alltoall", dtype, None, None, None)
            for root in range(self.size):
                yield ("broadcast", dtype, None, root, None)


def eager_kernels(size):
    """Every eager (kind, dtype, op, root, name, count) a step can use."""
    for dtype in ALL_DTYPES:
        ops = [op for op in REDUCE_OPS if not (dtype == tf.bool and op == hvd.Average)]
        for name in (None, "named"):
            for op in ops:
                yield ("allreduce", dtype, op, None, name, None)
                yield ("reducescatter", dtype, op, None, name, None)
            yield ("allgather", dtype, None, None, name, None)
            yield ("alltoall", dtype, None, None, name, None)
            for root in range(size):
                yield ("broadcast", dtype, None, root, name, None)
        for op in ops:
            for count in range(1, 5):
                yield ("grouped_allreduce", dtype, op, None, None, count)


def prime(functions, size):
    """Runs every tf.function and every eager kernel once, in the same order
    on every rank, so that TensorFlow's caches are full before RSS is read."""
    for kind, dtype, op, root, count in functions.all_keys():
        fn = functions.get(kind, dtype, op, root, count)
        x = tf.ones([size, 2], dtype)
        if kind == "alltoall":
            fn(x, tf.ones([size], tf.int32))
        elif kind == "grouped_allreduce":
            fn(*[x] * count)
        else:
            fn(x)
    for kind, dtype, op, root, name, count in eager_kernels(size):
        x = tf.ones([size, 2], dtype)
        name = f"soak_{kind}" if name else None
        if kind == "allreduce":
            hvd.allreduce(x, op=op, name=name)
        elif kind == "reducescatter":
            hvd.reducescatter(x, op=op, name=name)
        elif kind == "allgather":
            hvd.allgather(x, name=name)
        elif kind == "alltoall":
            hvd.alltoall(x, splits=[1] * size, name=name)
        elif kind == "broadcast":
            hvd.broadcast(x, root_rank=root, name=name)
        else:
            hvd.grouped_allreduce([x] * count, op=op)


def distinct_names(count):
    """RSS growth (MB) over `count` eager collectives, each with a new name
    (every kind of collective in turn, so every eager op variant is covered)."""
    x = tf.ones([16])
    size = hvd.size()
    kinds = [
        lambda n: hvd.allreduce(x, op=hvd.Sum, name=n),
        lambda n: hvd.grouped_allreduce([x, x], op=hvd.Sum, name=n),
        lambda n: hvd.allgather(x, name=n),
        lambda n: hvd.grouped_allgather([x, x], name=n),
        lambda n: hvd.broadcast(x, root_rank=0, name=n),
        lambda n: hvd.alltoall(tf.ones([2 * size]), name=n),
        lambda n: hvd.reducescatter(tf.ones([2 * size]), op=hvd.Sum, name=n),
        lambda n: hvd.grouped_reducescatter([tf.ones([2 * size])], op=hvd.Sum, name=n),
        lambda n: hvd.barrier(name=n),
    ]
    for i, run in enumerate(kinds):  # each kind's kernel is built once before measuring
        run(f"distinct_warm_up_{i}")
    before = rss_mb()
    for i in range(count):
        kinds[i % len(kinds)](f"distinct_{i}")
    return rss_mb() - before


def run_step(plan, step, seed, rank, size, functions):
    """Runs one planned collective; returns (got, want, dtype, op) pairs to check."""
    kind, dtype, name, use_fn = plan["kind"], plan["dtype"], plan["name"], plan["function"]
    op = plan.get("op")

    def inputs(slot, shape, d=dtype):
        return [rank_input(seed, step, r, slot, shape, d) for r in range(size)]

    if kind == "allreduce":
        xs = inputs(0, plan["shapes"][0])
        t = tf.constant(xs[rank], dtype)
        got = functions.get(kind, dtype, op)(t) if use_fn else hvd.allreduce(t, op=op, name=name)
        return [(got, reduce_np(xs, op, dtype, size), dtype, op)]
    if kind == "broadcast":
        xs = inputs(0, plan["shapes"][0])
        root = plan["root"]
        t = tf.constant(xs[rank], dtype)
        got = (functions.get(kind, dtype, root=root)(t) if use_fn
               else hvd.broadcast(t, root_rank=root, name=name))
        return [(got, xs[root], dtype, None)]
    if kind == "allgather":
        xs = [rank_input(seed, step, r, 0, [plan["rows"][r]] + plan["cols"], dtype)
              for r in range(size)]
        t = tf.constant(xs[rank], dtype)
        got = functions.get(kind, dtype)(t) if use_fn else hvd.allgather(t, name=name)
        return [(got, np.concatenate(xs), dtype, None)]
    if kind == "alltoall":
        matrix = plan["matrix"]  # matrix[src][dst]: rows src sends to dst
        xs = [rank_input(seed, step, r, 0, [sum(matrix[r])] + plan["cols"], dtype)
              for r in range(size)]
        t = tf.constant(xs[rank], dtype)
        pieces = []
        for src in range(size):
            start = sum(matrix[src][:rank])
            pieces.append(xs[src][start:start + matrix[src][rank]])
        want = np.concatenate(pieces)
        received = [matrix[src][rank] for src in range(size)]
        if use_fn:
            got, got_splits = functions.get(kind, dtype)(t, tf.constant(matrix[rank], tf.int32))
        elif plan["splits"] is None:
            got, got_splits = hvd.alltoall(t, name=name), received
        else:
            got, got_splits = hvd.alltoall(t, splits=matrix[rank], name=name)
        return [(got, want, dtype, None),
                (np.asarray(got_splits), np.asarray(received), tf.int32, None)]
    if kind == "reducescatter":
        shape = plan["shapes"][0]
        xs = inputs(0, shape)
        t = tf.constant(xs[rank], dtype)
        got = (functions.get(kind, dtype, op)(t) if use_fn
               else hvd.reducescatter(t, op=op, name=name))
        rows = shape[0]
        counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
        start = sum(counts[:rank])
        want = reduce_np(xs, op, dtype, size)[start:start + counts[rank]]
        return [(got, want, dtype, op)]
    if kind == "grouped_allreduce":
        xss = [inputs(i, s, d) for i, (s, d) in enumerate(zip(plan["shapes"], plan["dtypes"]))]
        ts = [tf.constant(xs[rank], d) for xs, d in zip(xss, plan["dtypes"])]
        if use_fn:
            gots = functions.get(kind, dtype, op, count=len(ts))(*ts)
        else:
            gots = hvd.grouped_allreduce(ts, op=op, name=name)
        return [(g, reduce_np(xs, op, d, size), d, op)
                for g, xs, d in zip(gots, xss, plan["dtypes"])]
    raise ValueError(kind)


def as_numpy(value):
    if isinstance(value, (tf.Tensor, tf.Variable)):
        value = value.numpy()
    value = np.asarray(value)
    if value.dtype == np.dtype(tf.bfloat16.as_numpy_dtype):
        value = value.astype(np.float32)
    return value


def describe(plan):
    keep = {k: v for k, v in plan.items() if k not in ("matrix",)}
    keep["dtype"] = plan["dtype"].name
    if "dtypes" in plan:
        keep["dtypes"] = [d.name for d in plan["dtypes"]]
    if "op" in plan:
        keep["op"] = OP_NAMES[plan["op"]]
    return keep


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int,
                        default=int(os.environ.get("TFRING_SOAK_COUNT", "2000")))
    parser.add_argument("--warmup", type=int, default=None,
                        help="random steps before the first RSS reading (default: count/10, "
                             "between 100 and 500)")
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--distinct-names", type=int, default=0, metavar="N",
                        help="afterwards, N eager allreduces each with a new name; prints the "
                             "RSS growth they cause")
    args = parser.parse_args()
    warmup = args.warmup if args.warmup is not None else min(500, max(100, args.count // 10))

    # Tracing the fixed set of functions one after another is intended; TF
    # would warn about "excessive retracing".
    tf.get_logger().setLevel("ERROR")
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    functions = Functions(size)
    prime(functions, size)

    gen = np.random.default_rng(args.seed)
    failures = 0
    checked = 0
    rss_warm = None
    start = None
    kinds_seen = {}
    curve = []  # RSS at every tenth of the measured steps
    for step in range(warmup + args.count):
        if step == warmup:
            rss_warm = rss_mb()
            start = time.monotonic()
        if step > warmup and (step - warmup) % max(1, args.count // 10) == 0:
            curve.append(rss_mb())
        plan = draw_step(gen, size)
        try:
            pairs = run_step(plan, step, args.seed, rank, size, functions)
            for got, want, dtype, op in pairs:
                checked += 1
                got = as_numpy(got)
                if not close(got, want, dtype, op):
                    failures += 1
                    if failures <= MAX_REPORTED:
                        print(f"MISMATCH rank={rank} step={step} plan={describe(plan)} "
                              f"got={got.ravel()[:8]} want={np.asarray(want).ravel()[:8]} "
                              f"shapes={got.shape}/{np.shape(want)}", flush=True)
        except tf.errors.OpError as e:
            failures += 1
            if failures <= MAX_REPORTED:
                print(f"MISMATCH rank={rank} step={step} plan={describe(plan)} error="
                      f"{type(e).__name__}: {' '.join(e.message.split())[:300]}", flush=True)
        if step >= warmup:
            key = plan["kind"] + ("/fn" if plan["function"] else "")
            kinds_seen[key] = kinds_seen.get(key, 0) + 1
    seconds = time.monotonic() - start
    rss_end = rss_mb()
    # Every rank drew the same plan: their generators must agree at the end.
    tail = gen.integers(2**62)
    tails = hvd.allgather(tf.constant([tail], tf.int64), name="soak_tail").numpy()
    if len(set(tails.tolist())) != 1:
        failures += 1
        print(f"MISMATCH rank={rank} generators diverged: {tails.tolist()}", flush=True)
    print(f"SOAK rank={rank} count={args.count} seconds={seconds:.2f} "
          f"rate={args.count / seconds:.1f} rss_warm_mb={rss_warm:.1f} rss_end_mb={rss_end:.1f} "
          f"checked={checked} failures={failures} traced={len(functions.cache)} "
          f"rss_curve_mb={','.join(f'{v:.1f}' for v in curve)} "
          f"kinds={','.join(f'{k}:{v}' for k, v in sorted(kinds_seen.items()))}", flush=True)
    if args.distinct_names:
        growth = distinct_names(args.distinct_names)
        print(f"NAMES rank={rank} count={args.distinct_names} rss_growth_mb={growth:.1f}",
              flush=True)
    hvd.shutdown()
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
