"""tests/torch: tfring.torch. Skipped where torch is not installed (a
failure under TFRING_REQUIRE_EXTRAS=1, as in CI). tfring.core's module is
built once here before any test launches ranks."""
import pytest

from support import import_extra


@pytest.fixture(scope="session")
def torch_ready():
    """torch is importable and tfring.core's module is built."""
    import_extra("torch")
    from tfring.build import core_module
    return core_module.ensure_module()
