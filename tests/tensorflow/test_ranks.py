"""Runs the rank suites in tests/tensorflow/ranks/ on 1, 2 and 3 ranks, under
each controller (MPI and TCP)."""
import os
import re

import pytest

from support import rank_lines, run_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_rank_suites(np_, controller):
    output = run_rank_suite(np_, SUITE, controller=controller)
    # Every rank must report its own pass line.
    passed = {r for r, text in rank_lines(output) if re.search(r"\d+ passed", text)}
    assert sorted(passed) == list(range(np_)), output[-5000:]
