"""tfring.core's default names: counted per process set, restarted when a
set id is registered again and at init()."""
from tfring.core import names


def test_counts_per_set_and_restarts():
    names.forget()
    assert [names.auto_name("allreduce", 0) for _ in range(2)] == [
        "allreduce.noname.0", "allreduce.noname.1"]
    # Calls in another set (which some ranks are not in) leave set 0's count alone.
    assert names.auto_name("allreduce", 5) == "allreduce.noname.0"
    assert names.auto_name("allgather", 0) == "allgather.noname.0"
    assert names.auto_name("allreduce", 0) == "allreduce.noname.2"
    names.forget(5)
    assert names.auto_name("allreduce", 5) == "allreduce.noname.0"
    assert names.auto_name("allreduce", 0) == "allreduce.noname.3"
    names.forget()
    assert names.auto_name("allreduce", 0) == "allreduce.noname.0"
