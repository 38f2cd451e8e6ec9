"""The elastic driver (tfring/runner/elastic/driver.py) without TensorFlow:
discovery parsing, tfringrun's elastic flags, and the driver's policies with
light workers that only join rounds (tfring.common.elastic needs no TF)."""
import os
import re
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


def test_elastic_worker_under_mpi_is_refused():
    from support import run_python
    result = run_python("import tfring.tensorflow as hvd; hvd.init()",
                        env={"TFRING_ELASTIC": "1", "TFRING_CONTROLLER": "mpi"})
    assert result.returncode != 0
    assert ("elastic training (TFRING_ELASTIC=1) runs over the TCP controller only: MPI "
            "cannot lose a rank.") in result.stderr


# A worker that starts the TCP controller and reports where it ended up.
PLACED = textwrap.dedent("""
    import os, socket
    import tensorflow as tf
    import tfring.tensorflow as hvd
    hvd.init()
    total = int(hvd.allreduce(tf.constant(1), op=hvd.Sum).numpy())
    print("PLACED", hvd.rank(), hvd.size(), hvd.local_rank(), total,
          os.environ.get("TFRING_HOSTNAME", socket.gethostname()), flush=True)
""")


def test_workers_on_other_hosts_start_over_ssh(tmp_path):
    from test_launch_tcp import FAKE_SSH
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH.format(python=sys.executable))
    (bin_dir / "ssh").chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_SSH_LOG": str(tmp_path / "ssh.log"), "FAKE_SSH_HOSTS": "fake-a,fake-b"}
    job = ElasticJob(tmp_path, "localhost:1\nfake-a:2", [sys.executable, "-c", PLACED], 3, 3, 3,
                     extra=["--network-interfaces", "lo"], env=env, timeout=180)
    with job:
        code, output = job.finish()
    assert code == 0, output
    placed = sorted(text.split()[1:] for _, text in rank_lines(output)
                    if text.startswith("PLACED"))
    import socket
    assert placed == [["0", "3", "0", "3", socket.gethostname()], ["1", "3", "0", "3", "fake-a"],
                      ["2", "3", "1", "3", "fake-a"]], output
    calls = (tmp_path / "ssh.log").read_text().splitlines()
    assert len(calls) == 2 and all('"fake-a"' in c for c in calls), calls
    assert leftovers(job) == []


def test_worker_that_never_reaches_init_is_stopped(tmp_path):
    job = ElasticJob(tmp_path, "localhost:1",
                     [sys.executable, "-c", "import time; time.sleep(300)"], 1, 1, 1,
                     extra=["--start-timeout", "2", "--elastic-timeout", "2"], timeout=120)
    with job:
        code, output = job.finish()
    assert code == 1, output
    assert ("worker 0 (on localhost) did not reach init() within 4 s (--start-timeout + "
            "--elastic-timeout); stopping it") in output
    assert "gave up after --elastic-timeout 2 s waiting for 1 more worker slot(s)" in output
    assert leftovers(job) == []


def test_exception_outside_elastic_run_ends_the_job_naming_it(tmp_path):
    script = JOINER + "\nraise RuntimeError('no elastic.run here')\n"
    job = ElasticJob(tmp_path, "localhost:2", [sys.executable, "-c", script], 2, 2, 2,
                     timeout=120)
    with job:
        code, output = job.finish()
    assert code == 1, output
    assert "raised RuntimeError: no elastic.run here; stopping the job." in output, output
    assert "round 2" not in output
    assert leftovers(job) == []


# The exit-code rule (docs/elastic.md): a worker that finished (returned from
# elastic.run, or ended its script) and then exits non-zero fails the job,
# whichever worker ends first; one lost mid-training (no word that it
# finished: os._exit, a signal, a crash) is recovered. The failing worker is
# rank 0 ending while the others still run ("first", the case that used to
# exit 0), or the last rank ending after the others finished ("last").
FINISHER = JOINER + textwrap.dedent("""
    how, order, gate = os.environ["HOW"], os.environ["ORDER"], os.environ["GATE"]
    if how == "elastic.run":  # the loop behind every framework's elastic.run
        state = elastic.ObjectState(lambda value, root: value, lambda: me["rank"])
        elastic.run_fn(lambda state: None, elastic.join_round, lambda e: False)(state)
    if me["rank"] == (0 if order == "first" else info["size"] - 1):
        while order == "last" and not os.path.exists(gate):
            time.sleep(0.05)
        if how == "script":
            sys.exit(3)
        os._exit(3)  # runs no exit handler: only elastic.run said it finished
    while order == "first" and not os.path.exists(gate):
        if elastic.round_replaced():
            info = elastic.join_round()
            print("JOINED", info["round"], info["size"], flush=True)
            break
        time.sleep(0.05)
""")


@pytest.mark.parametrize("np_, how, order", [
    (2, "script", "first"), (3, "script", "first"), (2, "elastic.run", "first"),
    (2, "script", "last"), (3, "script", "last"), (2, "elastic.run", "last"),
    (2, "killed", "first"), (2, "killed", "last")])
def test_exit_code_rule_in_both_orders_of_finishing(tmp_path, np_, how, order):
    gate = tmp_path / "gate"
    lost = how == "killed" and order == "first"
    job = ElasticJob(tmp_path, f"localhost:{np_}", [sys.executable, "-c", FINISHER], np_,
                     1 if lost else np_, np_,
                     env={"GATE": str(gate), "HOW": how, "ORDER": order}, timeout=120)
    failing = 0 if order == "first" else np_ - 1
    with job:
        if order == "last":
            job.wait_for(r"worker 0 \(on localhost, rank 0\) finished")
            gate.touch()
        elif not lost:
            job.wait_for(r"the job failed|; lost")
            gate.touch()  # the others now end with code 0: the first failure's code stays
        code, output = job.finish()
    if lost:
        assert code == 0, output
        assert "worker 0 (on localhost, rank 0) exited with code 3; lost" in output, output
        assert re.search(r"JOINED 2 1$", output, re.M), output
    else:
        assert code == 3, output
        after = "the job finished" if how == "killed" else "it finished training"
        assert (f"tfringrun: worker {failing} (on localhost, rank {failing}) exited with code 3 "
                f"after {after}; the job failed; stopping it.") in output, output
        assert "lost" not in output and "round 2" not in output, output
    assert leftovers(job) == []


@pytest.mark.parametrize("np_", [2, 3])
def test_publishing_a_round_deletes_the_previous_rounds_scope(np_):
    # Each round's registrations, ready marks and reset counter live in its
    # own scope; a long job with many resets must not pile them up.
    from types import SimpleNamespace

    from tfring._store import elastic_protocol as protocol
    from tfring._store import wire
    from tfring._store.rendezvous import RendezvousClient
    from tfring.runner.elastic.rounds import Rounds
    from wire_support import running_store
    workers = [SimpleNamespace(wid=w, key="h", host="h", rank=None) for w in range(np_)]
    with running_store() as (server, secret), RendezvousClient(*server.address, secret) as c:
        rounds = Rounds(c, min_np=1, elastic_timeout=10, reset_limit=None,
                        say=print, event=lambda text, always: None)
        for r in range(1, np_ + 1):
            rounds.publish(workers[:np_ - r + 1])
            c.set(protocol.round_scope(r), "reg/h/0", b"x")
        for r in range(1, np_):
            with pytest.raises(wire.ShuttingDownError, match="was deleted"):
                c.get(protocol.round_scope(r), "reg/h/0", timeout=5)
        assert c.get(protocol.round_scope(np_), "reg/h/0", timeout=5) == b"x"
        assert rounds.round == np_ and [w.rank for w in workers[:1]] == [0]


def test_shortfall_does_not_count_a_worker_its_peers_reported_lost():
    # A worker cut off by its peers may not have exited yet. The round
    # decision leaves it out; the "waiting for N more" line must count the
    # same workers, or it says "0 more ... 2 running" while the job waits.
    from tfring.runner.elastic.driver import _LOCAL, Driver, _Worker
    driver = Driver(["true"], np=2, min_np=2, max_np=2, discovery_script="true")
    driver.hosts = {_LOCAL: ("localhost", 2)}
    for wid in range(2):
        driver.workers[wid] = _Worker(wid, "localhost", local=True)
    driver.workers[1].cut_off = 1.0
    text = driver._shortfall("waiting for")
    assert text.startswith("waiting for 1 more worker slot(s): --min-np is 2 and "
                           "1 worker(s) are running"), text
