"""Fixtures shared by every rank suite (*/ranks/conftest.py imports them):
tfring is initialised once per rank, and `rank`/`size` are the job's."""
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
