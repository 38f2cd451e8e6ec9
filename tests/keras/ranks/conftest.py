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
                           size)


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
