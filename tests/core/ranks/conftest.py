"""Fixtures for tests/core/ranks/, which run inside every rank of a
tfringrun job (collected only with TFRING_RANK_TESTS=1; tests/core/
test_core_ranks.py launches them). Every rank runs the same tests in the same
order, so their collectives line up. Nothing here imports TensorFlow."""
import pytest

import rank_fixtures

# The shared fixtures start tfring.core here, not tfring.tensorflow.
rank_fixtures.BINDING = "tfring.core"
from rank_fixtures import (initialized, partial_set, rank, set_without_rank_0,  # noqa: E402,F401
                           size)


@pytest.fixture
def needs_peers(size):
    """Skips a test on a one-rank job (every rank alike)."""
    if size < 2:
        pytest.skip("needs ranks that can disagree")
