"""Fixtures for suites that run inside every rank of a tfringrun job.

These files are collected only when TFRING_RANK_TESTS=1 (set by the launcher
in tests/tensorflow/test_ranks.py). Every rank runs the same tests in the same
order, so their collectives line up.
"""
import pytest
from tf_helpers import MODES
# Shared by every rank suite.
from rank_fixtures import (initialized, partial_set, rank, set_without_rank_0,  # noqa: F401
                           size, tf_gpu)


@pytest.fixture(params=MODES)
def mode(request):
    return request.param
