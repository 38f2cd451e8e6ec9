"""Keras 3 model.fit, data-parallel on Ray actors, on scikit-learn's digits.

Run:  python examples/ray_keras_digits.py [--num-workers 2] [--epochs 4] [--address ADDR]

Without --address it starts a local Ray instance (one CPU per worker); with
``--address auto`` (or ``ray://...``) it joins a running cluster. The
training is examples/keras_digits.py's (same model, shards, seeds and
callbacks, without the checkpoint), in a function that
``tfring.ray.RayExecutor`` runs on every worker; each returns its rank, its
final weights and the held-out accuracy. The driver prints
``val_accuracy=...`` and whether every rank ended with the same weights.
Nothing is downloaded. Measured with 2 workers and 4 epochs on a 2-core VM:
val_accuracy=0.9583.
"""
import argparse


def train(epochs=4, batch_size=32, lr=0.03):
    """One rank's training; returns {"rank", "size", "val_accuracy", "weights"}."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import tfring.keras as hvd
    import tfring.keras.callbacks  # noqa: F401  (makes hvd.callbacks available)

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(rank)  # ranks start apart; the broadcast fixes that
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=0,
                                                      stratify=y)
    model = tf.keras.Sequential([
        tf.keras.Input(shape=(64,)),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = lr * size
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(scaled_lr, momentum=0.9))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=False)  # tfring's ops have no XLA kernels
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2),
    ]
    model.fit(x_train[rank::size], y_train[rank::size], batch_size=batch_size, epochs=epochs,
              validation_data=(x_val[rank::size], y_val[rank::size]), callbacks=callbacks,
              verbose=0)
    _, accuracy = model.evaluate(x_val, y_val, verbose=0)
    return {"rank": rank, "size": size, "val_accuracy": float(accuracy),
            "weights": model.get_weights()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--address", default=None,
                        help="a running Ray cluster (default: start a local one)")
    args = parser.parse_args()

    import numpy as np
    import ray
    from tfring.ray import RayExecutor

    if args.address:
        ray.init(address=args.address)
    else:
        # A Ray of its own on this machine ("local"), even where another
        # runs already: a bare ray.init() would join that one, which refuses
        # num_cpus.
        ray.init(address="local", num_cpus=args.num_workers, include_dashboard=False)
    executor = RayExecutor(num_workers=args.num_workers, cpus_per_worker=1)
    executor.start()
    try:
        results = executor.run(train, kwargs={"epochs": args.epochs})
    finally:
        executor.shutdown()
        ray.shutdown()
    same = all(all(np.array_equal(a, b) for a, b in zip(r["weights"], results[0]["weights"]))
               for r in results)
    print(f"ranks={[r['rank'] for r in results]}")
    print(f"ranks_in_sync={same}")
    print(f"val_accuracy={results[0]['val_accuracy']:.4f}", flush=True)


if __name__ == "__main__":
    main()
