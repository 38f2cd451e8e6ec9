"""Rank registration over the rendezvous store and the topology derived from
it. The derivation is a pure function (:func:`derive_topology`), so every
rank computes the same answer from the same registrations; the C++ core
does the same in tf_ops/common/transport/tcp/topology.cc (same rules, same
record format, checked against each other by tests/common/transport/test_tcp_cpp.py).

Rules (docs/wire.md, "Topology"):
- hosts are ordered by their ``order`` hint (the host's index in tfringrun's
  host list; -1 when ranks were started without a launcher), then by name;
- on each host, ranks are ordered by local slot;
- ranks are numbered host by host; ``local_rank`` is the index on the host,
  ``cross_rank`` the index of the host among the hosts that have that local
  rank, ``cross_size`` the number of such hosts (hosts may have uneven slots).
"""
import collections
import os
import socket

RECORD_PREFIX = "reg/"
_FIELDS = ("host", "pid", "addr", "slot", "order")

Registration = collections.namedtuple("Registration", "host pid addr slot order")
RankInfo = collections.namedtuple(
    "RankInfo", "rank size local_rank local_size cross_rank cross_size host pid addr slot")


def encode_registration(reg):
    """The record a rank stores: ``v1`` then one ``name=value`` line per field.
    Text, so the C++ core parses it without a JSON library."""
    for name in ("host", "addr"):
        value = getattr(reg, name)
        if not value or any(c in value for c in "\n\r=\0"):
            raise ValueError(f"registration {name} {value!r} must be non-empty and hold no "
                             f"newline, '=' or NUL")
    return ("v1\n" + "".join(f"{n}={getattr(reg, n)}\n" for n in _FIELDS)).encode("utf-8")


def decode_registration(data, key="?"):
    """Parses a record from :func:`encode_registration`; ValueError naming
    the key if it is malformed."""
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise ValueError(f"registration '{key}' is not UTF-8") from None
    if not lines or lines[0] != "v1" or lines[-1] != "":
        raise ValueError(f"registration '{key}' is not a v1 record")
    fields = {}
    for line in lines[1:-1]:
        name, sep, value = line.partition("=")
        if not sep or name not in _FIELDS or name in fields:
            raise ValueError(f"registration '{key}' has a bad line {line!r}")
        fields[name] = value
    if set(fields) != set(_FIELDS):
        raise ValueError(f"registration '{key}' lacks {sorted(set(_FIELDS) - set(fields))}")
    try:
        return Registration(fields["host"], int(fields["pid"]), fields["addr"],
                            int(fields["slot"]), int(fields["order"]))
    except ValueError:
        raise ValueError(f"registration '{key}': pid, slot and order must be integers") from None


def derive_topology(registrations):
    """Assigns ranks from registrations (any order in, same answer out).

    Args:
      registrations: iterable of Registration.

    Returns:
      list of RankInfo, indexed by rank.

    Raises:
      ValueError: no registrations, two registrations for the same host and
        slot, a negative slot, or one host with two different order hints.

    Example::

        derive_topology([Registration("a", 1, "10.0.0.1:7", 0, 0)])[0].rank == 0
    """
    by_host = collections.defaultdict(list)
    for reg in registrations:
        if reg.slot < 0:
            raise ValueError(f"host {reg.host!r} registered a negative slot {reg.slot}")
        by_host[reg.host].append(reg)
    if not by_host:
        raise ValueError("no rank registered")
    order = {}
    for host, regs in by_host.items():
        hints = {r.order for r in regs}
        if len(hints) > 1:
            raise ValueError(f"host {host!r} registered with different order hints "
                             f"{sorted(hints)}")
        slots = [r.slot for r in regs]
        dup = sorted({s for s in slots if slots.count(s) > 1})
        if dup:
            raise ValueError(f"host {host!r} has more than one rank in slot(s) {dup}")
        order[host] = hints.pop()
    # -1 (no launcher) sorts after every launcher-given index.
    hosts = sorted(by_host, key=lambda h: (order[h] < 0, order[h], h))
    size = sum(len(v) for v in by_host.values())
    per_local = collections.Counter()
    for host in hosts:
        for i in range(len(by_host[host])):
            per_local[i] += 1
    out, seen_local = [], collections.Counter()
    for host in hosts:
        regs = sorted(by_host[host], key=lambda r: r.slot)
        for local_rank, reg in enumerate(regs):
            out.append(RankInfo(len(out), size, local_rank, len(regs), seen_local[local_rank],
                                per_local[local_rank], reg.host, reg.pid, reg.addr, reg.slot))
            seen_local[local_rank] += 1
    return out


def register_rank(client, scope, size, addr, slot, host=None, order=-1, timeout=60.0):
    """Registers this process and waits for `size` registrations; returns
    (this rank's RankInfo, the whole topology).

    Args:
      client: a RendezvousClient.
      scope: the job's scope for this round (e.g. ``"<job>/<round>"``).
      size: how many ranks the job has.
      addr: this rank's listening address ("host:port").
      slot: this rank's local slot on its host.
      host: the host name (default: TFRING_HOSTNAME, else socket.gethostname()).
      order: the host's index in the launcher's host list, -1 if none.

    Raises:
      InvalidRequestError: another rank already registered this host and slot.
      WireTimeoutError: fewer than `size` ranks registered within `timeout`.
      ValueError: more than `size` ranks registered, or a malformed record.
    """
    host = host or os.environ.get("TFRING_HOSTNAME") or socket.gethostname()
    reg = Registration(host, os.getpid(), addr, int(slot), int(order))
    client.set(scope, f"{RECORD_PREFIX}{host}/{slot}", encode_registration(reg),
               exclusive=True)
    entries = client.wait_prefix(scope, RECORD_PREFIX, size, timeout)
    if len(entries) != size:
        raise ValueError(f"{len(entries)} ranks registered in scope '{scope}', but the job "
                         f"has {size}")
    topo = derive_topology(decode_registration(v, k) for k, v in entries)
    mine = [r for r in topo if r.host == host and r.slot == reg.slot]
    return mine[0], topo
