"""Runs the rank suites of tfring.torch (tests/torch/ranks/) on 1, 2 and 3
ranks, under each controller (MPI and TCP)."""
import os

import pytest

from support import check_rank_suite

SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks")


@pytest.mark.parametrize("np_", [1, 2, 3])
def test_torch_rank_suites(np_, controller, torch_ready):
    check_rank_suite(np_, SUITE, controller)
