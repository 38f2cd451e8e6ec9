"""Autotune converges on a live workload, and every rank ends up agreeing on
the chosen values, while every collective stays correct."""
import csv
import sys
import textwrap

from support import tfringrun

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import tfring.tensorflow as hvd
    from tfring.common.basics import _runtime_params
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    @tf.function
    def step(k):
        return [hvd.allreduce(tf.fill([256 * (i + 1)], tf.cast(k, tf.float32) + i + r), op=hvd.Sum)
                for i in range(12)]

    for k in range(600):
        for i, out in enumerate(step(tf.constant(k))):
            expected = n * (k + i) + n * (n - 1) / 2
            assert np.allclose(out.numpy(), expected), (k, i)
        done = int(_runtime_params()["autotune_done"]) if r == 0 else 0
        if hvd.broadcast(tf.constant(done), 0, name="tuned").numpy():
            break
    else:
        raise SystemExit("autotune did not finish in 600 steps")
    print("STEPS", k + 1, "PARAMS", hvd.allgather_object(sorted(
        (key, v) for key, v in _runtime_params().items() if key != "autotune_done")))
""")


def test_autotune_converges_and_ranks_agree(tmp_path):
    log = tmp_path / "autotune.csv"
    result = tfringrun(2, [sys.executable, "-c", SCRIPT], timeout=240, env={
        "TFRING_AUTOTUNE": "1", "TFRING_AUTOTUNE_LOG": str(log),
        "TFRING_AUTOTUNE_WARMUP_SAMPLES": "1", "TFRING_AUTOTUNE_STEPS_PER_SAMPLE": "2"})
    assert result.returncode == 0, result.stdout
    rows = list(csv.DictReader(open(log)))
    kinds = [row["sample"] for row in rows]
    assert kinds[0] == "warmup" and kinds[-1] == "best"
    samples = [row for row in rows if row["sample"].isdigit()]
    assert len(samples) >= 16  # the initial values plus every candidate of the three stages
    assert all(float(row["bytes_per_second"]) > 0 for row in samples)
    best = rows[-1]
    # The best row is the highest-scoring sample.
    assert float(best["bytes_per_second"]) == max(float(row["bytes_per_second"]) for row in samples)
    params = [line for line in result.stdout.splitlines() if "PARAMS" in line]
    assert len(params) == 2
    ranks_view = eval(params[0].split("PARAMS", 1)[1])  # one entry per rank
    assert ranks_view[0] == ranks_view[1]
    chosen = dict(ranks_view[0])
    assert chosen["fusion_threshold_bytes"] == int(best["fusion_threshold_bytes"])
    assert chosen["cycle_time_ms"] == float(best["cycle_time_ms"])
    assert chosen["shm_min_bytes"] == int(best["shm_min_bytes"])
