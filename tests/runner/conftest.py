"""Fixtures of the tfringrun tests."""
import pytest

from launch_support import CONTROLLER_ARGS


@pytest.fixture(params=list(CONTROLLER_ARGS))
def controller(request):
    """tfringrun's options for one controller: each test that takes it runs
    under MPI (mpiexec starts the ranks) and under TCP (tfringrun does)."""
    return CONTROLLER_ARGS[request.param]
