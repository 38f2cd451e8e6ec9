"""tfring.runner.engine_env: the environment of ranks that Ray or Spark
start. Pure functions; no engine needed."""
import itertools

import pytest

from tfring.runner import engine_env, topology, wire

SECRET = bytes(range(32))


def _derived_ranks(envs):
    """The ranks the core derives from what each worker registers."""
    regs = [topology.Registration(e["TFRING_HOSTNAME"], 1000 + i, f"10.0.0.1:{i + 1}",
                                  int(e["TFRING_LOCAL_SLOT"]), int(e["TFRING_HOST_ORDER"]))
            for i, e in enumerate(envs)]
    derived = topology.derive_topology(regs)
    return [next(r.rank for r in derived if (r.host, r.slot) == (reg.host, reg.slot))
            for reg in regs]


@pytest.mark.parametrize("hosts", [["a"], ["a", "a"], ["a", "b", "a"], ["z", "a", "z", "a"],
                                   ["n2", "n1", "n3", "n1", "n2"]])
def test_ranks_are_host_by_host_and_the_core_derives_the_same(hosts):
    ranks, envs = engine_env.worker_environments(hosts, "10.0.0.9", 29400, SECRET)
    assert sorted(ranks) == list(range(len(hosts)))
    by_rank = [hosts[ranks.index(r)] for r in range(len(hosts))]
    # Host by host, hosts in order of first appearance.
    assert by_rank == sorted(by_rank, key=hosts.index)
    assert [int(e["TFRING_RANK"]) for e in envs] == ranks
    assert _derived_ranks(envs) == ranks
    for e in envs:
        assert e["TFRING_CONTROLLER"] == "tcp"
        assert (e["TFRING_RENDEZVOUS_ADDR"], e["TFRING_RENDEZVOUS_PORT"]) == ("10.0.0.9", "29400")
        assert e["TFRING_SIZE"] == str(len(hosts))
        assert wire.decode_secret(e["TFRING_SECRET"]) == SECRET


def test_bind_addresses_devices_and_user_variables():
    ranks, envs = engine_env.worker_environments(
        ["b", "a", "b"], "h", 1, SECRET, bind_hosts=["10.0.0.2", "10.0.0.1", "10.0.0.2"],
        extra={"TFRING_FUSION_THRESHOLD": "1024", "TFRING_SIZE": "99"},
        devices=[["3"], ["0"], ["1"]])
    assert ranks == [0, 2, 1]
    assert [e["TFRING_BIND_HOST"] for e in envs] == ["10.0.0.2", "10.0.0.1", "10.0.0.2"]
    # Each host's workers see that host's GPUs, in rank order.
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3,1", "0", "3,1"]
    assert all(e["TFRING_FUSION_THRESHOLD"] == "1024" for e in envs)
    assert all(e["TFRING_SIZE"] == "3" for e in envs), "a user setting overrode the job's"
    assert "CUDA_VISIBLE_DEVICES" not in engine_env.worker_environments(["a"], "h", 1,
                                                                      SECRET)[1][0]


@pytest.mark.parametrize("hosts,bind,match", [
    ([], None, "no worker"),
    (["a", ""], None, "worker 1 reported no host"),
    (["a", "b"], ["x"], "1 bind addresses for 2 workers"),
])
def test_bad_placements_are_refused(hosts, bind, match):
    with pytest.raises(ValueError, match=match):
        engine_env.worker_environments(hosts, "h", 1, SECRET, bind_hosts=bind)


def test_attach_rank_names_the_rank_on_the_workers_own_exception():
    error = engine_env.attach_rank(KeyError("x"), 3, "raised on rank 3")
    assert isinstance(error, KeyError) and error.rank == 3
    assert error.__notes__ == ["raised on rank 3"]


def test_every_permutation_of_three_workers_on_two_hosts():
    for hosts in set(itertools.permutations(["p", "p", "q"])):
        ranks, envs = engine_env.worker_environments(list(hosts), "h", 1, SECRET)
        assert _derived_ranks(envs) == ranks
