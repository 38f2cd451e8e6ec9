"""The errors tfring raises carry a typed cause and rank
(tfring/common/exceptions.py, tfring/common/tf_errors.py), in step with the
core's FailureCause (tf_ops/common/status.h). The end-to-end checks (a
killed rank, a stall, shutdown, a mismatch) are in tests/common/test_faults.py
and tests/tensorflow/ranks/test_errors.py."""
import os
import pickle
import re

import pytest
import tensorflow as tf

from support import ROOT
from tfring.common import status, tf_errors
from tfring.common.exceptions import (FAILURE_PAYLOAD, Cause, HorovodInternalError, TfringError,
                                      cause_from_core, encode_failure, ends_job, failure_of)


def _core_causes():
    """{name: number} of status.h's FailureCause."""
    with open(os.path.join(ROOT, "tf_ops", "common", "status.h")) as f:
        body = re.search(r"enum class FailureCause : int \{(.*?)\};", f.read(), re.S).group(1)
    return {name: int(number) for name, number in re.findall(r"(\w+) = (\d+),", body)}


def test_python_causes_match_the_cores_numbers():
    core = _core_causes()
    assert core.pop("NONE") == 0
    assert {name: cause_from_core(number).name for name, number in core.items()} == \
        {name: name for name in core}
    assert set(core) == {c.name for c in Cause}


@pytest.mark.parametrize("code, tf_type", [(2, tf.errors.FailedPreconditionError),
                                           (3, tf.errors.AbortedError),
                                           (4, tf.errors.InvalidArgumentError),
                                           (1, tf.errors.UnknownError)])
def test_a_core_status_raises_its_tf_type_with_cause_and_rank(code, tf_type):
    with pytest.raises(tf_type) as info:
        status.raise_for_status(code, "the message", 3, 2)
    error = info.value
    assert isinstance(error, TfringError)
    assert error.message == "the message"
    assert error.cause is Cause.PEER_FAILURE and error.cause == "peer_failure"
    assert error.rank == 2
    assert isinstance(error, HorovodInternalError) == (code == 3)


def test_no_rank_reads_as_none_and_ok_raises_nothing():
    status.raise_for_status(0, "")
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        status._check((2, "ranks disagree", 4, -1))
    assert info.value.cause is Cause.MISMATCH and info.value.rank is None
    assert status._check((0, "", 0, -1, 7, [0, 1])) == (7, [0, 1])


def test_cause_and_rank_survive_pickling():
    # Ray and Spark send a rank's exception to the driver pickled.
    with pytest.raises(tf.errors.AbortedError) as info:
        status.raise_for_status(3, "rank 1 is gone", 3, 1)
    back = pickle.loads(pickle.dumps(info.value))
    assert type(back) is tf_errors.AbortedError
    assert (back.cause, back.rank, back.message) == (Cause.PEER_FAILURE, 1, "rank 1 is gone")


def test_a_tf_error_from_a_tfring_op_becomes_tfrings_type():
    # What TensorFlow raises itself (a graph, a Keras step): its own type
    # with the kernel's payload.
    raised = tf.errors.AbortedError(None, None, "stopped",
                                    {FAILURE_PAYLOAD: encode_failure(2, 0)})
    assert failure_of(raised) == (Cause.SHUTDOWN, 0) and ends_job(raised)
    typed = tf_errors.typed(raised)
    assert isinstance(typed, tf_errors.AbortedError) and isinstance(typed, tf.errors.AbortedError)
    assert (typed.cause, typed.rank, typed.message) == (Cause.SHUTDOWN, 0, "stopped")
    # An error of TensorFlow's own (no payload) stays as it is.
    plain = tf.errors.AbortedError(None, None, "another op")
    assert tf_errors.typed(plain) is plain and failure_of(plain) is None
    assert not ends_job(plain) and not ends_job(ValueError("x"))


def test_a_tf1_sessions_error_keeps_the_cause_of_the_ops():
    # Session.run re-raises the op's error as a new one of its type, without
    # the payloads, while handling it.
    try:
        try:
            raise tf.errors.AbortedError(None, None, "op", {FAILURE_PAYLOAD: encode_failure(3, 1)})
        except tf.errors.AbortedError as e:
            raise type(e)(None, None, "op, as the session tells it")
    except tf.errors.AbortedError as e:
        reraised = e
    assert failure_of(reraised) == (Cause.PEER_FAILURE, 1)
    typed = tf_errors.typed(reraised)
    assert (type(typed), typed.cause, typed.rank) == (tf_errors.AbortedError, Cause.PEER_FAILURE, 1)


def test_only_failures_that_end_the_job_are_echoes():
    assert {c for c in Cause if c.ends_job} == {Cause.SHUTDOWN, Cause.PEER_FAILURE, Cause.TIMEOUT}
