"""Fixtures for the Keras suites that run inside every rank of a tfringrun job.

These files are collected only when TFRING_RANK_TESTS=1 (set by the launcher
in tests/keras/test_ranks.py). Every rank runs the same tests in the same
order, so their collectives line up. `keras` is whatever tf.keras resolves to:
Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1.
"""
import shutil
import tempfile

import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
# Shared by every rank suite.
from rank_fixtures import (initialized, partial_set, rank, set_without_rank_0,  # noqa: F401
                           size, tf_gpu)


@pytest.fixture(scope="session")
def keras():
    return tf.keras


@pytest.fixture(scope="session")
def legacy_keras():
    """True under tf_keras (Keras 2), the same on every rank."""
    return tf.keras.__name__.startswith("tf_keras")


@pytest.fixture
def shared_dir():
    """A directory every rank sees (pytest's tmp_path differs by rank): rank 0
    makes it and sends its path; it is removed once every rank is done."""
    path = hvd.broadcast_object(tempfile.mkdtemp(prefix="tfring_keras_") if hvd.rank() == 0
                                else None, root_rank=0, name="shared_dir")
    yield path
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def gpu_like_auto(monkeypatch, keras, legacy_keras):
    """Makes Keras 3 resolve jit_compile="auto" as on a GPU machine, on this
    CPU-only one: the device list that Keras's resolver reads (TensorFlow's
    list_physical_devices() without a device type) gains a GPU. TensorFlow's
    placer and every query for a device type are untouched. tf_keras has no
    "auto" (it defaults to no XLA), so the test is skipped there."""
    if legacy_keras:
        pytest.skip("tf_keras does not turn XLA on by itself")
    real = tf.config.list_physical_devices
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")

    def list_physical_devices(device_type=None):
        devices = real(device_type)
        if device_type is None and not any(d.device_type == "GPU" for d in devices):
            devices = devices + [gpu]
        return devices

    monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
    probe = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    probe.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    assert probe.jit_compile is True, "Keras would not choose XLA with this GPU"

