"""Runs the rank suites in tests/keras/ranks/ on 2 and 3 ranks, with Keras 3
(tf.keras's default) and with tf_keras (TF_USE_LEGACY_KERAS=1), under each
controller (MPI and TCP).

(Named test_keras_ranks.py, not test_ranks.py: tests/tensorflow/test_ranks.py
has that basename, and pytest's default import mode cannot collect two test
modules with the same basename in one run.)
"""
import os
import re

import pytest

from support import rank_lines, run_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
@pytest.mark.parametrize("np_", [2, 3])
def test_keras_rank_suites(np_, flavour, controller, monkeypatch):
    # Keras 3 is what tf.keras gives when TF_USE_LEGACY_KERAS is unset.
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else {}
    output = run_rank_suite(np_, SUITE, env=env, controller=controller)
    # Every rank must report its own pass line.
    passed = {r for r, text in rank_lines(output) if re.search(r"\d+ passed", text)}
    assert sorted(passed) == list(range(np_)), output[-5000:]
