"""One Ray cluster shared by the Ray tests (starting one takes ~15 s).

It is a ``ray.cluster_utils.Cluster``: a head node that runs every test, and
nodes a test may add and remove (elastic resizes) while the others share
the head's resources."""
import os
import shutil
import signal
import tempfile

import pytest

from support import import_extra, live_pids

# The head's slots of this resource are the only ones until a test adds a
# node: a trainer that asks for one per worker grows and shrinks with nodes.
RESIZE_SLOT = "tfring_resize_slot"

# The processes of a Ray Train run (by the title Ray gives an actor's
# process): they end with the run. A fit's controller normally exits within
# a second of fit() returning; CI's load stretches that to a few seconds.
RUN_PROCESS_TITLES = ("ray::TrainController", "ray::RayTrainWorker")
RUN_PROCESS_EXIT_S = 20.0


def _title(pid):
    """A process's command line as ps shows it ("" once it has ended)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _threads(pid):
    """What each of a process's threads is doing, from /proc: its name,
    state and the kernel function it waits in (no debugger needed)."""
    found = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return found
    for tid in tids:
        parts = []
        for name in ("comm", "wchan"):
            try:
                with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                    parts.append(f.read().strip())
            except OSError:
                parts.append("?")
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                parts.insert(1, f.read().rpartition(")")[2].split()[0])
        except OSError:
            parts.insert(1, "?")
        found.append(" ".join(parts))
    # Ray's many gRPC and event threads wait alike: each kind once, counted.
    return [f"{line} x{found.count(line)}" if found.count(line) > 1 else line
            for line in dict.fromkeys(found)]


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

    def processes():
        """The cluster's processes now: its own, the added nodes', and every
        worker and actor under them."""
        return set(roots + descendants(roots) + added + descendants(added))
    cluster.processes = processes

    def run_processes(titles=RUN_PROCESS_TITLES):
        """Those of its processes that belong to a Ray Train run."""
        return {pid for pid in processes() if _title(pid).startswith(titles)}
    cluster.run_processes = run_processes
    yield cluster
    started = processes()
    ray.shutdown()
    cluster.shutdown()
    try:
        left = live_pids(sorted(started), wait=10.0)
        assert not left, "Ray's processes outlived the cluster's shutdown: " + "; ".join(
            f"{pid} {_title(pid)!r} threads {_threads(pid)}" for pid in left)
    finally:
        del os.environ["RAY_TMPDIR"]
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(autouse=True)
def ray_train_run_ends_with_its_test(request):
    """A test that used the cluster leaves no process of a Ray Train run
    (controller, workers) behind: they end with their fit(). One that is
    still there RUN_PROCESS_EXIT_S after the test fails that test, naming
    the process and what its threads wait in, and is killed (so that the
    session's end checks the other processes, not it again)."""
    if "ray_cluster" not in request.fixturenames:
        yield
        return
    cluster = request.getfixturevalue("ray_cluster")
    before = cluster.run_processes()
    yield
    left = sorted(cluster.run_processes() - before)
    left = live_pids(left, wait=RUN_PROCESS_EXIT_S)
    if not left:
        return
    found = {pid: (_title(pid), _threads(pid)) for pid in left}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    pytest.fail(f"{request.node.nodeid} left Ray Train processes running "
                f"{RUN_PROCESS_EXIT_S:g} s after it ended (now killed): " + "; ".join(
                    f"{pid} {title!r} threads {threads}"
                    for pid, (title, threads) in found.items()))
