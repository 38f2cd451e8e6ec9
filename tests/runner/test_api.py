"""tfring.run (tfring/runner/api.py, run_task.py): Horovod's horovod.run,
fixed-size under both controllers at np=2 and np=3, and elastic."""
import os
import sys
import threading
import warnings

import cloudpickle
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import exit_rule_support  # noqa: E402
import tfring  # noqa: E402
from exit_rule_support import end_in_order  # noqa: E402
from launch_support import processes_with  # noqa: E402
from tfring.runner import RankFailedError  # noqa: E402

# The ranks cannot import this test module: send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(exit_rule_support)

CONTROLLERS = {"mpi": {"use_mpi": True}, "tcp": {"use_gloo": True}}


@pytest.fixture(params=list(CONTROLLERS))
def controller(request):
    return CONTROLLERS[request.param]


def launch_rank():
    return int(os.environ.get("PMI_RANK") or os.environ["TFRING_RANK"])


def allreduce_rank(scale, offset=0):
    """Joins the job and returns (rank, size, sum over ranks of rank+1) * scale + offset.
    On tfring.core, whose ranks start in a fraction of TensorFlow's time:
    tfring.run starts ranks alike whatever framework the function uses."""
    import numpy as np

    import tfring.core as hvd
    hvd.init()
    total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum)
    return hvd.rank(), hvd.size(), float(total[0]) * scale + offset, launch_rank()


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def fail_on_last(size, kind=ValueError):
    if launch_rank() == size - 1:
        raise kind(f"bad batch on the last rank of {size}")
    return launch_rank()


@pytest.mark.parametrize("np_", [2, 3])
def test_results_come_back_in_rank_order(controller, np_):
    results = tfring.run(allreduce_rank, args=(10,), kwargs={"offset": 1}, num_proc=np_,
                         timeout=300, **controller)
    total = np_ * (np_ + 1) / 2
    assert results == [(r, np_, total * 10 + 1, r) for r in range(np_)]


@pytest.mark.parametrize("np_", [2, 3])
def test_a_failing_rank_raises_its_own_exception_naming_it(tmp_path, controller, np_):
    with pytest.raises(ValueError, match=f"bad batch on the last rank of {np_}") as info:
        tfring.run(fail_on_last, args=(np_,), num_proc=np_, timeout=120, run_dir=tmp_path,
                   **controller)
    exc = info.value
    assert exc.rank == np_ - 1
    assert f"raised on rank {np_ - 1}" in exc.__notes__[0]
    cause = exc.__cause__
    assert isinstance(cause, RankFailedError) and cause.rank == np_ - 1
    assert str(cause).startswith(f"rank {np_ - 1} raised ValueError: bad batch")
    assert "in fail_on_last" in cause.remote_traceback
    assert processes_with(str(tmp_path)) == []  # the ranks' command lines name run_dir


def test_an_exception_that_does_not_pickle_comes_back_as_rank_failed_error():
    with pytest.raises(RankFailedError, match="rank 1 raised Unpicklable: bad batch") as info:
        tfring.run(fail_on_last, args=(2, Unpicklable), num_proc=2, use_gloo=True, timeout=120)
    assert info.value.rank == 1 and info.value.exit_code == 1


def test_a_rank_that_dies_without_an_exception_fails_the_call():
    def die():
        if launch_rank() == 1:
            os._exit(7)
        return 0
    with pytest.raises(RankFailedError, match="tfringrun exit code 7") as info:
        tfring.run(die, num_proc=2, use_gloo=True, timeout=120)
    assert info.value.rank is None


def test_deprecated_np_warns_and_runs():
    with pytest.warns(DeprecationWarning, match="np is deprecated, use num_proc instead"):
        assert tfring.run(launch_rank, np=2, use_gloo=True, timeout=120) == [0, 1]


def test_a_function_the_ranks_cannot_load_is_named():
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    try:
        with pytest.raises(RuntimeError, match="the ranks cannot load the function: "
                                               "ModuleNotFoundError"):
            tfring.run(launch_rank, num_proc=2, use_gloo=True, timeout=120)
    finally:
        cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_num_proc_defaults_to_the_host_lists_slots_else_one():
    assert tfring.run(launch_rank, hosts="localhost:3", use_gloo=True, timeout=120) == [0, 1, 2]
    assert tfring.run(launch_rank, use_gloo=True, timeout=120) == [0]


def test_tfring_runner_run_is_tfring_run():
    import tfring.runner
    assert tfring.runner.run is tfring.run


@pytest.mark.parametrize("kwargs, message", [
    ({"num_proc": 2, "np": 3}, "give num_proc or its deprecated alias np, not both"),
    ({"min_num_proc": 2, "min_np": 1, "host_discovery_script": "true"},
     "give min_num_proc or its deprecated alias min_np"),
    ({"hosts": "localhost:2", "hostfile": "hosts.txt"}, "give hosts or hostfile, not both"),
    ({"use_gloo": True, "use_mpi": True}, "give use_gloo or use_mpi, not both"),
    ({"min_num_proc": 2}, "needs host_discovery_script"),
    ({"host_discovery_script": "true", "use_mpi": True}, "TCP controller"),
    ({"host_discovery_script": "true", "hosts": "localhost:2"}, "not hosts/hostfile"),
    ({"num_proc": 2, "max_num_proc": 3, "slots": 1}, "max_num_proc, slots apply to elastic"),
    ({"num_proc": 2, "hosts": "localhost:1,node7.invalid:1"},
     "ranks on node7.invalid cannot read this host's temporary directory"),
])
def test_conflicting_arguments_are_refused_before_launch(kwargs, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(ValueError, match=message):
            tfring.run(launch_rank, **kwargs)


def elastic_member(scale):
    """Joins the elastic job's round like init() does; returns its place in it."""
    from tfring.common import elastic
    info = elastic.join_round()
    me = info["members"][os.environ["TFRING_ELASTIC_WORKER"]]
    if os.environ.get("FAIL_RANK") == str(me["rank"]):
        raise KeyError("lost shard")
    return me["rank"], info["size"], scale


@pytest.mark.parametrize("np_", [2, 3])
def test_elastic_run_returns_the_round_in_rank_order(tmp_path, np_):
    results = tfring.run(elastic_member, args=(5,), num_proc=np_, min_num_proc=np_,
                         max_num_proc=np_, host_discovery_script=f"echo localhost:{np_}",
                         timeout=180)
    assert results == [(r, np_, 5) for r in range(np_)]


def test_elastic_run_raises_the_failing_workers_exception():
    with pytest.raises(KeyError, match="lost shard") as info:
        tfring.run(elastic_member, args=(5,), num_proc=2, min_num_proc=2, max_num_proc=2,
                   host_discovery_script="echo localhost:2", env={"FAIL_RANK": "1"},
                   timeout=180)
    assert info.value.rank == 1


@pytest.mark.parametrize("elastic", [False, True])
@pytest.mark.parametrize("failing", [0, 1])
def test_a_rank_exiting_non_zero_after_its_function_returned_fails_the_call(
        tmp_path, elastic, failing):
    # The exit-code rule (docs/elastic.md), in both orders of finishing: the
    # first rank to end fails, or the last one does.
    options = (dict(min_num_proc=2, max_num_proc=2, host_discovery_script="echo localhost:2")
               if elastic else dict(use_gloo=True))
    with pytest.raises(RankFailedError, match="exit code 3") as info:
        tfring.run(end_in_order, args=(str(tmp_path), failing, elastic), num_proc=2,
                   timeout=120, **options)
    assert info.value.exit_code == 3


def test_results_travel_through_a_given_run_dir_and_it_is_left_clean(tmp_path):
    assert tfring.run(launch_rank, num_proc=2, use_gloo=True, run_dir=tmp_path,
                      timeout=120) == [0, 1]
    assert list(tmp_path.iterdir()) == []
