"""The TensorFlow framework's rank suites, one launch per configuration: the
TF ops (tests/tensorflow/ranks/) and, from 2 ranks on, Keras 3 on top of
them (tests/keras/ranks/, tf.keras's default), collected by one pytest in
each rank. Each size runs once, the controllers in turn (what the binding
adds does not depend on the controller); the bit-exact numerics suite runs
alone on 4 ranks.

The np x controller x plane matrix of the collectives themselves is the C++
conformance suite's (tests/common/ops/test_conformance_cpp.py) and the
per-plane run's (tests/common/ops/test_planes.py); these suites check what the binding adds
(dtypes and shapes, modes, gradients, errors, Keras). tf_keras, the other
Keras flavour, has launches of its own (tests/keras/test_keras_ranks.py).
"""
import os

import pytest

from support import ROOT, check_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")
KERAS_SUITE = os.path.join(ROOT, "tests", "keras", "ranks")
CONFIGURATIONS = [(1, "mpi"), (2, "tcp"), (3, "mpi")]


@pytest.mark.parametrize("np_, controller", CONFIGURATIONS,
                         ids=[f"np{n}-{c}" for n, c in CONFIGURATIONS])
def test_rank_suites(np_, controller, monkeypatch):
    # Keras 3 is what tf.keras gives when TF_USE_LEGACY_KERAS is unset.
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    suites = [SUITE, KERAS_SUITE] if np_ >= 2 else [SUITE]
    check_rank_suite(np_, suites, controller)


# Horovod's own tests allow a tolerance from 4 ranks on; on one host tfring
# is exact at any size, checked here at 4 as well. The data plane on one host
# is the same under either controller, so the default one runs it.
@pytest.mark.parametrize("np_", [4])
def test_numerics_suite(np_):
    check_rank_suite(np_, os.path.join(SUITE, "test_numerics.py"))
