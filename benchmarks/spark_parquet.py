"""The estimator's data path: a rank streaming its share of a Parquet set
through pyarrow into tf.data (tfring.spark.data, what KerasEstimator's
ranks run), against the same rows held in memory as numpy.

Same model, same ranks (tfring.run, TCP), one epoch of each rank's share,
batch 1024, shuffle buffer as the estimator's default (64 batches) in both
modes. Each mode runs as a job of its own, so each rank's peak resident
memory (ru_maxrss) is its own. Spark is not in the loop: it only writes the
Parquet in a fit; the training read is this.

    python benchmarks/spark_parquet.py --rows 2000000 --width 64 --np 2
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np


def _write(path, rows, width, chunk=200_000):
    import pyarrow as pa
    import pyarrow.parquet as pq
    os.makedirs(path)
    rng = np.random.default_rng(0)
    coef = rng.normal(size=width).astype(np.float32)
    for i, start in enumerate(range(0, rows, chunk)):
        n = min(chunk, rows - start)
        x = rng.normal(size=(n, width)).astype(np.float32)
        y = x @ coef
        column = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), width)
        pq.write_table(pa.table({"x": pa.array(column, pa.list_(pa.float32())), "y": y}),
                       f"{path}/part-{i:05d}.parquet", row_group_size=64_000)


def _rank(mode, path, width, batch):
    import resource

    import tensorflow as tf

    import tfring.keras as hvd
    from tfring.spark import data
    from tfring.spark.common.store import Store
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    store = Store.create(path)
    layout = {"inputs": [["x"]], "labels": ["y"], "weight": None,
              "widths": {"x": width, "y": 0}}
    buffer = 64 * batch
    if mode == "stream":
        dataset, counts = data.dataset(store, path, rank, size, layout, batch, buffer)
    else:
        share, counts = data.plan_share(store, path, rank, size)
        parts = list(data.batches(store, share, ["x", "y"], 65536))
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        del parts
        dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(buffer).repeat()
                   .batch(batch).prefetch(2))
    steps = min(counts) // batch
    tf.keras.utils.set_random_seed(rank)
    model = tf.keras.Sequential([tf.keras.Input((width,)), tf.keras.layers.Dense(256,
                                 activation="relu"), tf.keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)),
                  loss="mse", jit_compile=False)
    model.fit(dataset, steps_per_epoch=20, epochs=1, verbose=0)   # warm-up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
    seconds = time.perf_counter() - started
    return {"rank": rank, "samples_per_s": steps * batch / seconds, "seconds": seconds,
            "rows": counts[rank], "peak_rss_mb": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 1024, "rss_after_warmup_mb": before}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args()
    import tfring
    scratch = tempfile.mkdtemp(prefix="tfring-parquet-bench-")
    try:
        path = os.path.join(scratch, "train")
        started = time.perf_counter()
        _write(path, args.rows, args.width)
        size_mb = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)) / 2**20
        print(f"parquet: {args.rows} rows x {args.width} float32, {size_mb:.0f} MB on disk, "
              f"written in {time.perf_counter() - started:.1f} s; load: "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        out = {}
        for mode in ("memory", "stream"):
            results = tfring.run(_rank, args=(mode, path, args.width, args.batch),
                                 num_proc=args.np, use_gloo=True, env={"CUDA_VISIBLE_DEVICES": ""})
            out[mode] = results
            rate = sum(r["samples_per_s"] for r in results)
            print(f"{mode:6s}: {rate:10.0f} samples/s (all ranks), peak RSS per rank "
                  f"{[round(r['peak_rss_mb']) for r in results]} MB, after warm-up "
                  f"{[round(r['rss_after_warmup_mb']) for r in results]} MB", flush=True)
        ratio = (sum(r["samples_per_s"] for r in out["stream"]) /
                 sum(r["samples_per_s"] for r in out["memory"]))
        print(f"stream / memory: {ratio:.2f}; load after: {os.getloadavg()[0]:.2f}")
        print(json.dumps(out))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
