"""The elastic driver (tfring/runner/elastic/driver.py) without TensorFlow:
discovery parsing, tfringrun's elastic flags, and the driver's policies with
light workers that only join rounds (tfring.common.elastic needs no TF)."""
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic_support import ElasticJob, leftovers, rank_lines  # noqa: E402
from tfring.runner import launch  # noqa: E402
from tfring.runner.elastic.driver import DriverError, parse_discovery  # noqa: E402


def test_parse_discovery_lines():
    text = "# hosts\nnode1:4\n\nnode2:2  # spare\nnode3\n"
    assert parse_discovery(text, slots_per_host=1) == {"node1": 4, "node2": 2, "node3": 1}
    assert parse_discovery("") == {}


@pytest.mark.parametrize("text, message", [
    ("node1\n", "gives no slot count; print host:slots or pass --slots-per-host"),
    ("node1:x\n", "slots must be a non-negative integer"),
    ("node1:2\nnode1:3\n", "host 'node1' is listed twice"),
    (":3\n", "names no host"),
])
def test_parse_discovery_rejects_bad_lines(text, message):
    with pytest.raises(DriverError, match=message.replace("(", r"\(")):
        parse_discovery(text)


@pytest.mark.parametrize("args, message", [
    (["-np", "2", "--min-np", "1"], "need --host-discovery-script"),
    (["--mpi", "-np", "2", "--host-discovery-script", "true"], "TCP controller only"),
    (["-H", "localhost:2", "-np", "2", "--host-discovery-script", "true"],
     "not -H/--hostfile"),
    (["--host-discovery-script", "true"], "needs -np (or --min-np)"),
    (["-np", "2", "--min-np", "3", "--host-discovery-script", "echo localhost:2"],
     "need 1 <= --min-np (3) <= -np (2) <= --max-np"),
    (["-np", "2", "--elastic-timeout", "0", "--host-discovery-script", "true"],
     "--elastic-timeout must be positive"),
])
def test_elastic_flags_are_checked(capsys, args, message):
    assert launch.main(args + [sys.executable, "-c", "pass"]) == 2
    assert message in capsys.readouterr().err


def test_failing_discovery_script_is_named(capsys):
    code = launch.main(["-np", "1", "--host-discovery-script", "echo oops >&2; exit 3",
                        sys.executable, "-c", "pass"])
    assert code == 2
    assert "exited with code 3: oops" in capsys.readouterr().err


# A light worker: joins rounds like init() does, reports its round, exits.
JOINER = textwrap.dedent("""
    import os, sys, time
    from tfring.common import elastic
    info = elastic.join_round()
    me = info["members"][os.environ["TFRING_ELASTIC_WORKER"]]
    print("JOINED", info["round"], info["size"], me["rank"], flush=True)
    if os.environ.get("FAIL_AFTER_JOIN"):
        sys.exit(int(os.environ["FAIL_AFTER_JOIN"]))
""")


def test_workers_that_keep_failing_get_their_host_blacklisted(tmp_path):
    # Workers die before they ever join: each is a lost worker of this host.
    job = ElasticJob(tmp_path, "localhost:9", [sys.executable, "-c", "import sys; sys.exit(5)"],
                     2, 2, 2, extra=["--elastic-timeout", "3"], timeout=120)
    with job:
        code, output = job.finish()
    assert code == 1, output
    assert "localhost lost 3 workers; it gets no new workers for the rest of the job" in output
    assert "blacklisted" in output.split("gave up after")[-1], output
    assert leftovers(job) == []


def test_rank_zero_is_the_oldest_worker_and_a_finished_job_ends(tmp_path):
    job = ElasticJob(tmp_path, "localhost:3", [sys.executable, "-c", JOINER], 3, 3, 3,
                     timeout=120)
    with job:
        code, output = job.finish()
    assert code == 0, output
    joined = sorted((w, text.split()[1:]) for w, text in rank_lines(output)
                    if text.startswith("JOINED"))
    assert joined == [(0, ["1", "3", "0"]), (1, ["1", "3", "1"]), (2, ["1", "3", "2"])], output
    assert leftovers(job) == []


def test_driver_killed_leaves_no_worker_behind(tmp_path):
    job = ElasticJob(tmp_path, "localhost:2",
                     [sys.executable, "-c", JOINER + "\ntime.sleep(300)\n"], 2, 2, 2,
                     timeout=120)
    with job:
        job.wait_for(r"JOINED 1 2 1")
        job.kill()  # SIGKILL to tfringrun: the wrappers see it go and stop their workers
        assert leftovers(job, wait=15) == []
