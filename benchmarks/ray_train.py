"""TfringTrainer (Keras 3) vs Ray's TensorflowTrainer (tf_keras + MWMS), issue 36.

    python benchmarks/ray_train.py [--workers 2] [--epochs 6] [--out benchmarks/RESULTS_RAY.md]

Both trainers run the same small Keras CNN (Conv2D 16x3x3, max-pool, Dense
64, Dense 10) on scikit-learn's digits (8x8x1 images, 1437 for training,
360 held out), on a local Ray instance, 32 images per worker per step, SGD
with momentum, the same epochs. The data is each worker's half of the
training set (TfringTrainer: rank::size of numpy arrays; TensorflowTrainer:
the whole set, global batch 32*workers, auto-sharded by data, as
MultiWorkerMirroredStrategy expects). Measured on rank 0 of each run:

* steps/s: steps of the epochs after the first, over their wall time
  (the first epoch holds the tracing);
* time to first step: from the driver's ``fit()`` call to the end of rank
  0's first training step (Ray's worker start, TensorFlow's import, the
  job's or strategy's start-up, the first step's tracing);
* final accuracy: ``evaluate`` on the held-out 360 images.

It writes a markdown table (with the command, the machine's load and the
versions) to --out and prints it.
"""
import argparse
import json
import os
import platform
import sys
import tempfile
import time

EPOCH_TIMES = "epochs.json"


def _data():
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32).reshape(-1, 8, 8, 1)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def _model(keras):
    return keras.Sequential([
        keras.Input(shape=(8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def _timing_callback(keras, out, rank):
    """Rank 0 writes the wall time of its first step's end and each epoch's
    (start, end, steps)."""

    class Timing(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.first, self.epochs, self.steps = None, [], 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append([time.time(), None, 0])

        def on_train_batch_end(self, batch, logs=None):
            if self.first is None:
                self.first = time.time()
            self.epochs[-1][2] += 1

        def on_epoch_end(self, epoch, logs=None):
            self.epochs[-1][1] = time.time()

        def on_train_end(self, logs=None):
            if rank == 0:
                with open(os.path.join(out, EPOCH_TIMES), "w") as f:
                    json.dump({"first": self.first, "epochs": self.epochs}, f)

    return Timing()


def tfring_loop(config):
    import keras
    import ray.train

    import tfring.keras as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(config["seed"])
    x_train, x_val, y_train, y_val = _data()
    model = _model(keras)
    model.compile(optimizer=hvd.DistributedOptimizer(
        keras.optimizers.SGD(config["lr"], momentum=0.9)),
        loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    # Whole batches only, the same steps as the TensorflowTrainer run.
    steps = len(x_train) // (config["batch"] * size)
    x_train, y_train = (a[rank::size][:steps * config["batch"]] for a in (x_train, y_train))
    model.fit(x_train, y_train, batch_size=config["batch"],
              epochs=config["epochs"], verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         _timing_callback(keras, config["out"], rank)])
    _, accuracy = model.evaluate(x_val, y_val, verbose=0)
    ray.train.report({"val_accuracy": float(accuracy)})
    if rank == 0:
        with open(os.path.join(config["out"], "accuracy.json"), "w") as f:
            json.dump(float(accuracy), f)


def tensorflow_loop(config):
    import ray.train
    import tensorflow as tf
    import tf_keras as keras  # MultiWorkerMirroredStrategy's fit needs Keras 2
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = ray.train.get_context().get_world_rank()
    size = ray.train.get_context().get_world_size()
    keras.utils.set_random_seed(config["seed"])
    x_train, x_val, y_train, y_val = _data()
    with strategy.scope():
        model = _model(keras)
        model.compile(optimizer=keras.optimizers.SGD(config["lr"], momentum=0.9),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    # Whole batches only, as the tfring run's shards (equal steps per rank).
    steps = len(x_train) // (config["batch"] * size)
    n = steps * config["batch"] * size
    dataset = tf.data.Dataset.from_tensor_slices((x_train[:n], y_train[:n])).batch(
        config["batch"] * size)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = \
        tf.data.experimental.AutoShardPolicy.DATA
    model.fit(dataset.with_options(options), epochs=config["epochs"], verbose=0,
              callbacks=[_timing_callback(keras, config["out"], rank)])
    _, accuracy = model.evaluate(x_val, y_val, verbose=0)
    ray.train.report({"val_accuracy": float(accuracy)})
    if rank == 0:
        with open(os.path.join(config["out"], "accuracy.json"), "w") as f:
            json.dump(float(accuracy), f)


def _measure(name, make_trainer, config):
    out = tempfile.mkdtemp(prefix=f"ray-bench-{name}-")
    config = dict(config, out=out)
    start = time.time()
    make_trainer(config).fit()
    total = time.time() - start
    with open(os.path.join(out, EPOCH_TIMES)) as f:
        times = json.load(f)
    with open(os.path.join(out, "accuracy.json")) as f:
        accuracy = json.load(f)
    later = times["epochs"][1:]
    steps = sum(e[2] for e in later)
    seconds = sum(e[1] - e[0] for e in later)
    return {"name": name, "steps_per_s": steps / seconds, "first_step_s": times["first"] - start,
            "accuracy": accuracy, "fit_s": total, "steps_per_epoch": times["epochs"][0][2]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--out", default=None, help="write the markdown table here too")
    args = parser.parse_args()

    import ray
    import tensorflow as tf
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    from tfring.ray import TfringTrainer

    load_before = os.getloadavg()
    ray.init(num_cpus=args.workers + 1, include_dashboard=False, log_to_driver=False)
    config = {"epochs": args.epochs, "batch": 32, "lr": 0.05, "seed": 0}
    storage = tempfile.mkdtemp(prefix="ray-bench-storage-")
    scaling = ScalingConfig(num_workers=args.workers)
    try:
        results = [
            _measure("TfringTrainer (Keras 3)", lambda c: TfringTrainer(
                tfring_loop, train_loop_config=c, scaling_config=scaling,
                run_config=RunConfig(name="tfring", storage_path=storage)), config),
            _measure("TensorflowTrainer (tf_keras + MWMS)", lambda c: TensorflowTrainer(
                tensorflow_loop, train_loop_config=c, scaling_config=scaling,
                run_config=RunConfig(name="tf", storage_path=storage)), config),
        ]
    finally:
        ray.shutdown()
    load_after = os.getloadavg()
    command = "python benchmarks/ray_train.py " + " ".join(sys.argv[1:])
    lines = [
        "# Ray Train: TfringTrainer vs TensorflowTrainer",
        "",
        f"Generated by `{command.strip()}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); "
        "what is measured: the script's docstring.",
        "",
        f"{args.workers} workers, a local Ray {ray.__version__} on {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), TensorFlow {tf.__version__}; "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"{args.epochs} epochs of {results[0]['steps_per_epoch']} steps, 32 images per "
        "worker per step.",
        "",
        "| trainer | steps/s (epochs 2+) | time to first step | final val accuracy | fit() |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r['name']} | {r['steps_per_s']:.1f} | {r['first_step_s']:.1f} s | "
                     f"{r['accuracy']:.4f} | {r['fit_s']:.1f} s |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
