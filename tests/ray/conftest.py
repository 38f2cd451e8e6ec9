"""A local Ray instance shared by the Ray tests (starting one takes ~15 s)."""
import os

import pytest

from support import import_extra, live_pids


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance with 4 logical CPUs (enough for 3 one-CPU
    workers; the machine may have fewer cores: Ray's CPUs are only
    bookkeeping). When the session ends it is shut down, and no process it
    started may outlive it."""
    ray = import_extra("ray")
    from tfring.runner.processes import descendants
    before = set(descendants([os.getpid()]))
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 << 20,
             log_to_driver=False)
    # Ray's own processes (GCS, raylet, ...): what this process started just
    # now; every worker and actor is under them.
    roots = [p for p in descendants([os.getpid()]) if p not in before]
    yield ray
    started = roots + descendants(roots)
    ray.shutdown()
    assert not live_pids(started, wait=10.0), "Ray's processes outlived ray.shutdown()"
