"""Runs the rank suites of tfring.torch (tests/torch/ranks/) on 1, 2 and 3
ranks: each size once, the controllers (MPI and TCP) in turn. tfring.core's
own suite runs every size under both (tests/core/test_core_ranks.py)."""
import os

import pytest

from support import check_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


# Each size once, the controllers in turn (the controllers' own matrix is the
# conformance suite's and tfring.core's; tests/tensorflow/test_ranks.py).
CONFIGURATIONS = [(1, "mpi"), (2, "tcp"), (3, "mpi")]


@pytest.mark.parametrize("np_, controller", CONFIGURATIONS,
                         ids=[f"np{n}-{c}" for n, c in CONFIGURATIONS])
def test_torch_rank_suites(np_, controller, torch_ready):
    check_rank_suite(np_, SUITE, controller)
