"""Fixtures for the data-plane rank suites (run inside every rank).

The outer tests in tests/common/ops/ launch these suites with environment
variables that force one data plane (TFRING_CPU_OPERATIONS=shm|ring|mpi, cut-over
sizes, fake hosts through TFRING_HOSTNAME=a,a,b,...), so each suite checks the
collectives as they run on that plane.
"""
import os

import pytest

import tfring.tensorflow as hvd


@pytest.fixture(scope="session", autouse=True)
def initialized():
    hvd.init()
    yield


@pytest.fixture(scope="session")
def rank():
    return hvd.rank()


@pytest.fixture(scope="session")
def size():
    return hvd.size()


@pytest.fixture(scope="session")
def plane():
    """The data plane this launch forces (TFRING_CPU_OPERATIONS), default auto."""
    return os.environ.get("TFRING_CPU_OPERATIONS", "auto")
