"""Fixtures for suites that run inside every rank of a tfringrun job.

These files are collected only when TFRING_RANK_TESTS=1 (set by the launcher
in tests/tensorflow/test_ranks.py). Every rank runs the same tests in the same
order, so their collectives line up.
"""
import pytest
from tf_helpers import MODES
from rank_fixtures import initialized, rank, size  # noqa: F401  (shared by every rank suite)


@pytest.fixture(params=MODES)
def mode(request):
    return request.param
