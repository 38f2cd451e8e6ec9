"""Rank registration and topology derivation (tfring.runner.topology): the
pure derivation with several hosts and uneven slots, and N concurrent
clients that register over a real store and all derive the same answer."""
import random
import threading

import pytest

from tfring.runner import wire
from tfring.runner.rendezvous import RendezvousClient
from tfring.runner.topology import (Registration, decode_registration, derive_topology,
                                    encode_registration, register_rank)
from wire_support import running_store


def regs_for(slots, orders=None):
    """Registrations for hosts h0, h1, ... with the given slot counts."""
    out = []
    for i, n in enumerate(slots):
        for s in range(n):
            out.append(Registration(f"h{i}", 1000 + 10 * i + s, f"10.0.0.{i}:{7000 + s}", s,
                                    -1 if orders is None else orders[i]))
    return out


def table(topo):
    return [(r.rank, r.host, r.slot, r.local_rank, r.local_size, r.cross_rank, r.cross_size)
            for r in topo]


def test_uneven_hosts():
    topo = derive_topology(regs_for([3, 1, 2]))
    assert table(topo) == [
        (0, "h0", 0, 0, 3, 0, 3),
        (1, "h0", 1, 1, 3, 0, 2),
        (2, "h0", 2, 2, 3, 0, 1),
        (3, "h1", 0, 0, 1, 1, 3),
        (4, "h2", 0, 0, 2, 2, 3),
        (5, "h2", 1, 1, 2, 1, 2),
    ]
    assert all(r.size == 6 for r in topo)
    assert topo[4].addr == "10.0.0.2:7000" and topo[4].pid == 1020


def test_the_answer_does_not_depend_on_arrival_order():
    regs = regs_for([2, 4, 1, 3])
    expected = table(derive_topology(regs))
    rng = random.Random(5)
    for _ in range(20):
        rng.shuffle(regs)
        assert table(derive_topology(regs)) == expected


def test_launcher_order_hints_come_before_names_and_slots_may_have_gaps():
    regs = regs_for([1, 2, 1], orders=[2, 0, -1])
    regs.append(Registration("h1", 5, "10.0.0.1:9", 7, 0))  # slot 7: gap after 0, 1
    topo = derive_topology(regs)
    assert [(r.host, r.slot, r.local_rank) for r in topo] == [
        ("h1", 0, 0), ("h1", 1, 1), ("h1", 7, 2), ("h0", 0, 0), ("h2", 0, 0)]


@pytest.mark.parametrize("bad,message", [
    ([], "no rank registered"),
    ([Registration("a", 1, "a:1", 0, -1), Registration("a", 2, "a:2", 0, -1)],
     r"host 'a' has more than one rank in slot\(s\) \[0\]"),
    ([Registration("a", 1, "a:1", -1, -1)], "negative slot -1"),
    ([Registration("a", 1, "a:1", 0, 0), Registration("a", 2, "a:2", 1, 1)],
     r"different order hints \[0, 1\]"),
], ids=["none", "duplicate_slot", "negative_slot", "order_hints"])
def test_bad_registrations_are_named(bad, message):
    with pytest.raises(ValueError, match=message):
        derive_topology(bad)


def test_record_round_trip_and_malformed_records():
    reg = Registration("node-1.example", 42, "10.1.2.3:4567", 3, 1)
    assert decode_registration(encode_registration(reg)) == reg
    for data, message in [(b"v2\n", "not a v1 record"), (b"v1\nhost=a\n", "lacks"),
                          (b"v1\nhost=a\nhost=b\n", "bad line"), (b"\xff", "not UTF-8"),
                          (b"v1\nhost=a\npid=x\naddr=a\nslot=0\norder=-1\n", "integers")]:
        with pytest.raises(ValueError, match=message):
            decode_registration(data, "reg/a/0")
    with pytest.raises(ValueError, match="newline"):
        encode_registration(Registration("a\nb", 1, "a:1", 0, -1))


def test_concurrent_clients_register_and_derive_the_same_topology():
    slots = {"node-a": 5, "node-b": 3, "node-c": 4}  # uneven, 12 ranks
    size = sum(slots.values())
    with running_store() as (server, secret):
        results, errors = {}, []

        def rank(host, slot):
            try:
                with RendezvousClient(*server.address, secret) as c:
                    results[(host, slot)] = register_rank(
                        c, "job-7/0", size, f"127.0.0.1:{20000 + len(host) + slot}", slot,
                        host=host, timeout=30)
            except Exception as e:  # reported below with the rank it came from
                errors.append((host, slot, e))
        threads = [threading.Thread(target=rank, args=(h, s)) for h, n in slots.items()
                   for s in range(n)]
        random.Random(3).shuffle(threads)
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(results) == size
        topologies = {tuple(table(topo)) for _, topo in results.values()}
        assert len(topologies) == 1
        topo = results[("node-a", 0)][1]
        assert [r.host for r in topo] == ["node-a"] * 5 + ["node-b"] * 3 + ["node-c"] * 4
        for (host, slot), (mine, _) in results.items():
            assert (mine.host, mine.slot) == (host, slot)
            assert topo[mine.rank] == mine
        # A second rank claiming a taken slot is refused by name.
        with RendezvousClient(*server.address, secret) as c:
            with pytest.raises(wire.InvalidRequestError,
                               match="key 'reg/node-b/1' in scope 'job-7/0' is already set"):
                register_rank(c, "job-7/0", size, "127.0.0.1:1", 1, host="node-b", timeout=1)
            # Too few ranks: a timeout that says how many arrived.
            with pytest.raises(wire.WireTimeoutError, match=r"have 1\)"):
                register_rank(c, "job-7/1", 2, "127.0.0.1:1", 0, host="node-a", timeout=0.3)
