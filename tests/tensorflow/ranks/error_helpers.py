"""Helpers for rank-suite tests of bad input (tests/tensorflow/ranks/).

Every rank runs the same tests in the same order, so a test that expects an
error calls the same helpers on every rank: each rank checks its own error,
and the test module's autouse fixture then checks that the next collective
works (check_next_collective), i.e. the bad call cost nothing but an error.
"""
import threading

import pytest
import tensorflow as tf

import tfring.tensorflow as hvd
from tfring.common.exceptions import Cause, TfringError, failure_of


@pytest.fixture
def needs_peers(size):
    """Skips a test on a one-rank job. It depends only on the job's size, so
    every rank skips alike and their collectives stay in step."""
    if size < 2:
        pytest.skip("needs ranks that can disagree")


# Import `needs_peers` too in the module that uses this mark (pytest finds
# fixtures by name in the test module).
multi_rank = pytest.mark.usefixtures("needs_peers")


def _raised(error_type, fn, *fragments):
    """Calls fn(), which must raise `error_type` with every fragment in its
    message; returns (the exception, its message)."""
    with pytest.raises(error_type) as info:
        fn()
    message = getattr(info.value, "message", None) or str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    return info.value, message


def expect_error(error_type, fn, *fragments):
    """Calls fn(), which must raise `error_type` with every fragment in its
    message; returns the message."""
    return _raised(error_type, fn, *fragments)[1]


def expect_precondition(fn, *fragments, cause=Cause.MISMATCH):
    """A cross-rank problem: FailedPreconditionError on every rank, whose
    cause is a mismatch (or `cause`). In eager mode it is tfring's type of
    it (.cause, .rank); from a tf.function TensorFlow's, whose payload says
    the same."""
    error, message = _raised(tf.errors.FailedPreconditionError, fn, *fragments)
    assert failure_of(error) == (cause, None), message
    if isinstance(error, TfringError):
        assert error.cause is cause and error.rank is None
    return message


def expect_invalid_argument(fn, *fragments):
    """A problem this rank finds by itself: InvalidArgumentError."""
    return expect_error(tf.errors.InvalidArgumentError, fn, *fragments)


def check_next_collective(size, name="after_bad_input"):
    """The job goes on: a plain allreduce over every rank still works."""
    total = hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name=name).numpy()
    assert total == size, f"allreduce after the error gave {total}, not {size}"


class Background:
    """Runs fn() on a daemon thread (a collective another rank has not
    submitted yet blocks; the test goes on meanwhile). A daemon thread, so a
    collective that never completes cannot keep the process from exiting."""

    def __init__(self, fn):
        self.value = None
        self.error = None
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except Exception as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def wait(self, timeout=30.0):
        """Waits for fn to end; fails the test if it is still blocked."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"still blocked after {timeout} s"
        return self

    def done(self):
        return not self._thread.is_alive()
