"""Fixtures for the data-plane rank suites (run inside every rank).

The outer tests in tests/common/ops/ launch these suites with environment
variables that force one data plane (TFRING_CPU_OPERATIONS=shm|ring|mpi, cut-over
sizes, fake hosts through TFRING_HOSTNAME=a,a,b,...), so each suite checks the
collectives as they run on that plane.
"""
import os

import pytest
from rank_fixtures import initialized, rank, size  # noqa: F401  (shared by every rank suite)


@pytest.fixture(scope="session")
def plane():
    """The data plane this launch forces (TFRING_CPU_OPERATIONS), default auto."""
    return os.environ.get("TFRING_CPU_OPERATIONS", "auto")
