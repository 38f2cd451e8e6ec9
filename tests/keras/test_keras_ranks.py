"""The Keras rank suites (tests/keras/ranks/) with tf_keras
(TF_USE_LEGACY_KERAS=1), at np=2 under MPI and np=3 under TCP. With Keras 3,
tf.keras's default, the same suites run in the TF framework's launches
(tests/tensorflow/test_ranks.py: np=2 under TCP, np=3 under MPI), so each
flavour runs at each size, and each size under each controller, once. What
Keras adds sits above the transport, whose own cases are the conformance
suite's and the TF ops'.

(Named test_keras_ranks.py, not test_ranks.py: tests/tensorflow/test_ranks.py
has that basename, and pytest's default import mode cannot collect two test
modules with the same basename in one run.)
"""
import os

import pytest

from support import check_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


@pytest.mark.parametrize("np_, controller", [(2, "mpi"), (3, "tcp")])
def test_tf_keras_rank_suites(np_, controller):
    check_rank_suite(np_, SUITE, controller, env={"TF_USE_LEGACY_KERAS": "1"})
