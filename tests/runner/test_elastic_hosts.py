"""Elastic training across fake hosts that have network stacks of their own
(tests/netns_support.py: network namespaces behind a bridge, workers started
in them through a fake ssh): a host cut off the network in the middle of
training is left out and the job goes on; once it is back, the next round
takes it in again.

Needs root and `ip netns`; skipped (with the reason) where the machine does
not allow it. At 2 hosts only: the chaos run (tests/chaos) cuts hosts of a
job of 3 and 4 and lists them again, every run, with the same checks.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import netns_support  # noqa: E402
from elastic_support import ElasticJob, leftovers, rank_lines  # noqa: E402
from support import ROOT  # noqa: E402

WORKER = [sys.executable, os.path.join(ROOT, "tests", "tensorflow", "elastic_worker.py")]

pytestmark = pytest.mark.skipif(not netns_support.available(),
                                reason="needs root and network namespaces (ip netns)")


def _listing(names):
    return "\n".join(f"{n}:1" for n in names)


def _fields(output, word):
    """[(worker id, [fields])] of the workers' lines starting with `word`."""
    return [(w, text.split()[1:]) for w, text in rank_lines(output)
            if text.split()[:1] == [word]]


def _job(tmp_path, hosts, names, **env):
    """An elastic job with one slot on each fake host (all of `names`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hosts.ssh_command(str(bin_dir))
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "TFRING_HEARTBEAT_SECONDS": "1", **env}
    return ElasticJob(tmp_path, _listing(names), WORKER, len(names), 1, len(names), env=env,
                      extra=["--network-interfaces", hosts.interfaces()], timeout=300)


@pytest.mark.parametrize("np_", [2])
def test_cut_host_still_listed_is_left_out_and_the_job_goes_on(tmp_path, np_):
    # The discovery script still lists the host (it has not noticed): the
    # driver learns from the survivors that its worker is gone, although
    # that worker's process looks alive from here, and re-forms without it.
    names = [f"h{i}" for i in range(np_)]
    victim = names[-1]
    with netns_support.FakeHosts(names) as hosts:
        with _job(tmp_path, hosts, names, ELASTIC_STEPS="16") as job:
            job.wait_for(rf"\]<stdout>:SIZE 2 {np_}", timeout=240)
            hosts.cut(victim)
            code, output = job.finish()
        left = leftovers(job)
    assert code == 0, output[-8000:]
    assert left == [], left
    lost = np_ - 1
    assert f"worker {lost} (on {victim}, rank {lost}) is gone for its peers" in output, \
        output[-8000:]
    assert f"round 2: {np_ - 1} workers" in output, output[-8000:]
    finals = {w for w, _ in _fields(output, "FINAL")}
    assert finals == set(range(np_ - 1)), output[-8000:]
    sizes = {int(f[0]): int(f[1]) for _, f in _fields(output, "SIZE")}
    assert sizes[0] == np_ and sizes[15] == np_ - 1, sizes


@pytest.mark.parametrize("np_", [2])
def test_cut_host_is_left_out_and_taken_in_again_once_back(tmp_path, np_):
    names = [f"h{i}" for i in range(np_)]
    victim, wait_step = names[-1], 30
    with netns_support.FakeHosts(names) as hosts:
        # The survivors wait at step 30 until the job is whole again, so the
        # host comes back while they train.
        with _job(tmp_path, hosts, names, ELASTIC_STEPS="36", ELASTIC_WAIT_SIZE=str(np_),
                  ELASTIC_WAIT_SIZE_STEP=str(wait_step)) as job:
            job.wait_for(rf"\]<stdout>:SIZE 2 {np_}", timeout=240)
            # Pulled cable: the host drops out of the discovery script's
            # output too, as a script that checks its hosts would see it.
            hosts.cut(victim)
            job.set_hosts(_listing(names[:-1]))
            job.wait_for(rf"\]<stdout>:RESET \d+ {np_ - 1}", timeout=120)
            hosts.restore(victim)
            job.set_hosts(_listing(names))
            code, output = job.finish()
        left = leftovers(job)
    assert code == 0, output[-8000:]
    assert left == [], left
    lost = np_ - 1  # the worker started on the victim
    assert f"worker {lost} (on {victim}, rank {lost}) leaves" in output, output[-8000:]
    finals = {w: json.loads(" ".join(f[1:])) for w, f in _fields(output, "FINAL")}
    # The survivors and the worker started on the host once it was back.
    assert sorted(finals) == list(range(np_ - 1)) + [np_], output[-8000:]
    assert len({json.dumps(v) for v in finals.values()}) == 1, "the weights differ"
    sizes = {int(f[0]): int(f[1]) for _, f in _fields(output, "SIZE")}
    assert sizes[0] == np_ and sizes[wait_step] == np_ and sizes[wait_step - 1] == np_ - 1, sizes
