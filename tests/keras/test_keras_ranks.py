"""Runs the rank suites in tests/keras/ranks/ on 2 and 3 ranks, with Keras 3
(tf.keras's default) and with tf_keras (TF_USE_LEGACY_KERAS=1), under both
controllers (MPI and TCP): each flavour at each size, and each size under
each controller, once. What Keras adds sits above the transport, whose own
cases are the conformance suite's (tests/tensorflow/test_planes.py) and the
TF ops' (tests/tensorflow/test_ranks.py, every size under every controller);
all eight combinations took ~8 minutes of CI's budget for no other case.

(Named test_keras_ranks.py, not test_ranks.py: tests/tensorflow/test_ranks.py
has that basename, and pytest's default import mode cannot collect two test
modules with the same basename in one run.)
"""
import os
import re

import pytest

from support import rank_lines, run_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


@pytest.mark.parametrize("flavour, np_, controller", [
    ("keras3", 2, "mpi"), ("keras3", 3, "tcp"), ("tf_keras", 2, "tcp"), ("tf_keras", 3, "mpi")])
def test_keras_rank_suites(np_, flavour, controller, monkeypatch):
    # Keras 3 is what tf.keras gives when TF_USE_LEGACY_KERAS is unset.
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else {}
    output = run_rank_suite(np_, SUITE, env=env, controller=controller)
    # Every rank must report its own pass line.
    passed = {r for r, text in rank_lines(output) if re.search(r"\d+ passed", text)}
    assert sorted(passed) == list(range(np_)), output[-5000:]
