"""Runs the rank suites of tfring.torch (tests/torch/ranks/) on 1, 2 and 3
ranks: each size once, and np=3 under each controller (MPI and TCP)."""
import os

import pytest

from support import check_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


# Each size once, and np=3 under each controller (the controllers' own
# matrix is the conformance suite's; tests/tensorflow/test_ranks.py).
CONFIGURATIONS = [(1, "mpi"), (2, "tcp"), (3, "mpi"), (3, "tcp")]


@pytest.mark.parametrize("np_, controller", CONFIGURATIONS,
                         ids=[f"np{n}-{c}" for n, c in CONFIGURATIONS])
def test_torch_rank_suites(np_, controller, torch_ready):
    check_rank_suite(np_, SUITE, controller)
