"""Fixtures for tests/torch/ranks/, which run inside every rank of a
tfringrun job (tests/torch/test_torch_ranks.py launches them). Every rank
runs the same tests in the same order, so their collectives line up."""
import pytest

import rank_fixtures

rank_fixtures.BINDING = "tfring.torch"
from rank_fixtures import (initialized, partial_set, rank, set_without_rank_0,  # noqa: E402,F401
                           size)


@pytest.fixture
def needs_peers(size):
    """Skips a test on a one-rank job (every rank alike)."""
    if size < 2:
        pytest.skip("needs ranks that can disagree")
