"""tests/core: the framework-neutral API (tfring.core). Its module is built
once, here, before any test launches ranks (each rank would otherwise wait
on the build inside its job's timeout)."""
import pytest


@pytest.fixture(scope="session")
def core_module_path():
    """The path of the built _tfring_core (built into the cache if needed)."""
    from tfring.build import core_module
    return core_module.ensure_module()
