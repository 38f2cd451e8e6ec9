"""Process sets through tfring.core: collectives over a subset of ranks,
with set ranks that differ from job-wide ones."""
import numpy as np
import pytest

import tfring.core as hvd
from core_helpers import expect_error


def test_allreduce_and_allgather_in_a_partial_set(partial_set, rank):
    members = partial_set.ranks
    if not partial_set.included():
        assert partial_set.rank() == -1
        expect_error(hvd.InvalidArgumentError, lambda: hvd.allreduce(
            np.ones(1), process_set=partial_set), "not a member")
        return
    assert partial_set.size() == len(members)
    assert partial_set.rank() == members.index(rank)
    out = hvd.allreduce(np.full(2, rank, np.int64), op=hvd.Sum, process_set=partial_set)
    np.testing.assert_array_equal(out, [sum(members)] * 2)
    gathered = hvd.allgather(np.full((1,), rank, np.int32),
                             process_set=partial_set.process_set_id)
    np.testing.assert_array_equal(gathered, members)


def test_broadcast_root_is_a_job_wide_rank(set_without_rank_0, rank, size):
    if not set_without_rank_0.included():
        return
    root = size - 1
    out = hvd.broadcast(np.full(3, rank, np.float32), root, process_set=set_without_rank_0)
    np.testing.assert_array_equal(out, [root] * 3)


def test_global_set_and_unregistered_sets(size):
    assert hvd.global_process_set.size() == size
    out = hvd.allreduce(np.ones(1), op=hvd.Sum, process_set=hvd.global_process_set)
    assert out[0] == size
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(np.ones(1), process_set=hvd.ProcessSet([0]))
