"""Fixtures shared by every rank suite (*/ranks/conftest.py imports them):
tfring is initialised once per rank, and `rank`/`size` are the job's.

They drive the binding named by BINDING, imported when first used:
tfring.tensorflow, unless a suite's conftest sets another (tests/core/ranks
sets tfring.core, which must not import TensorFlow) before its tests run."""
import importlib
import os

import pytest

BINDING = "tfring.tensorflow"


def _hvd():
    return importlib.import_module(BINDING)


@pytest.fixture(scope="session", autouse=True)
def initialized():
    _hvd().init()
    # TFRING_TEST_PIDS_DIR: the driver wants to know the ranks' pids (whose
    # shared-memory segments are named by them: tests/common/ops/test_planes.py).
    pids_dir = os.environ.get("TFRING_TEST_PIDS_DIR")
    if pids_dir:
        with open(os.path.join(pids_dir, f"pid.{_hvd().rank()}"), "w") as f:
            f.write(str(os.getpid()))
    yield


@pytest.fixture(scope="session")
def rank():
    return _hvd().rank()


@pytest.fixture(scope="session")
def size():
    return _hvd().size()


def _registered_set(size, ranks):
    """Adds the process set `ranks` on every rank (a collective call), yields
    it and removes it again. Skipped alike on every rank of a one-rank job,
    where no set can leave a rank out."""
    if size < 2:
        pytest.skip("needs a rank outside the process set")
    ps = _hvd().add_process_set(ranks)
    try:
        yield ps
    finally:
        _hvd().remove_process_set(ps)


@pytest.fixture
def set_without_rank_0(size):
    """Ranks 1..size-1: set ranks differ from job-wide ranks, the case where
    Horovod's job-wide root_rank and a set rank part ways."""
    yield from _registered_set(size, list(range(1, size)))


@pytest.fixture(params=["without_rank_0", "without_last_rank"])
def partial_set(request, size):
    """A process set that leaves one rank out: rank 0 (so the set starts at
    rank 1) or the last rank."""
    ranks = list(range(1, size)) if request.param == "without_rank_0" else list(range(size - 1))
    yield from _registered_set(size, ranks)


@pytest.fixture(scope="session")
def tf_gpu():
    """The GPU that TensorFlow sees, as a device string, for the `tf_gpu`
    suites (TF kernels on GPU tensors). Skipped where TensorFlow sees no GPU
    or tfring's op library is a CPU build (CI); failed instead under
    TFRING_REQUIRE_GPU=1, where a skip would prove nothing."""
    import tensorflow as tf
    from support import missing_gpu

    why = None
    if not tf.config.list_physical_devices("GPU"):
        why = "TensorFlow sees no GPU"
    elif not _hvd().nccl_built():
        why = "tfring's op library is a CPU build (build it with TFRING_WITH_NCCL=1)"
    if why:
        missing_gpu(why)
    return "/GPU:0"


def expect_error(error_type, fn, *fragments):
    """Calls fn(), which must raise `error_type` with every fragment in its
    message; returns the exception. (The TF suites' own, in
    tests/tensorflow/ranks/error_helpers.py, also reads TF's messages.)"""
    with pytest.raises(error_type) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), f"{fragment!r} not in: {info.value}"
    return info.value
