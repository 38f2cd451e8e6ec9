"""One Ray cluster shared by the Ray tests (starting one takes ~15 s).

It is a ``ray.cluster_utils.Cluster``: a head node that runs every test, and
nodes a test may add and remove (elastic resizes) while the others share
the head's resources."""
import os
import shutil
import tempfile

import pytest

from support import import_extra, live_pids

# The head's slots of this resource are the only ones until a test adds a
# node: a trainer that asks for one per worker grows and shrinks with nodes.
RESIZE_SLOT = "tfring_resize_slot"


@pytest.fixture(scope="session")
def ray_cluster():
    """A cluster whose head has 4 logical CPUs (enough for 3 one-CPU
    workers; the machine may have fewer cores: Ray's CPUs are only
    bookkeeping) and 2 ``RESIZE_SLOT``s. When the session ends it is shut
    down, and no process it started may outlive it."""
    ray = import_extra("ray")
    from ray.cluster_utils import Cluster

    from tfring.runner.processes import descendants
    # Ray Train waits this long for a worker group's placement group (its
    # resources, nothing more: the workers start after it) before it tries a
    # smaller one. After a node is removed, Ray still counts its resources
    # for a while, so a shrink waits out this timeout once; the default is
    # 60 s. On one machine a placement group whose resources exist is ready
    # within a second. Ray hands the variable on to its controller.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "8")
    # Ray Train's controller looks at its workers this often (default 2 s):
    # a fit ends, and a dead worker is seen, at the next look. A test's
    # groups are small, and a look costs a few actor calls.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    # Ray's files (sessions, sockets, and ray_current_cluster, the address
    # that a plain ray.init() on this machine connects to) in a directory of
    # this session's: a Ray job that another worker runs (the docs' Ray
    # example) starts its own cluster, as a user's would, and does not join
    # this one. Short: Ray's socket paths must fit 107 characters.
    ray_tmp = tempfile.mkdtemp(prefix="tfr-ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = ray_tmp
    before = set(descendants([os.getpid()]))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "resources": {RESIZE_SLOT: 2}, "object_store_memory": 200 << 20,
        "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    # For the tests (a conftest is not importable by name: pytest loads
    # several modules called conftest).
    cluster.resize_slot = RESIZE_SLOT
    # The processes of the nodes the tests add are Ray's too.
    added = []
    add_node = cluster.add_node

    def add_node_and_note(**kwargs):
        node = add_node(**kwargs)
        added.extend(process.pid for _, process in node.live_processes())
        return node
    cluster.add_node = add_node_and_note
    # Ray's own processes (GCS, raylets, ...): what this process started just
    # now; every worker and actor is under them.
    roots = [p for p in descendants([os.getpid()]) if p not in before]
    yield cluster
    # With those of the nodes the tests added (and their workers).
    started = set(roots + descendants(roots) + added + descendants(added))
    ray.shutdown()
    cluster.shutdown()
    try:
        assert not live_pids(sorted(started), wait=10.0), \
            "Ray's processes outlived the cluster's shutdown"
    finally:
        del os.environ["RAY_TMPDIR"]
        shutil.rmtree(ray_tmp, ignore_errors=True)
