"""Host lists for tfringrun: ``-H host:slots,...`` and ``--hostfile FILE``.

A host list is an ordered list of :class:`Host` (name, slots). Ranks fill the
slots in order, as ``horovodrun`` and MPICH's hydra both do: with
``-H a:2,b:2`` ranks 0-1 run on ``a`` and ranks 2-3 on ``b``.

Accepted syntax (Horovod's, plus the MPICH/Open MPI hostfile forms):

* ``-H``: comma-separated ``host`` or ``host:slots``; a bare host has 1 slot.
* hostfile: one host per line, as ``host``, ``host:4``, ``host slots=4`` or
  ``host slots=4 max_slots=8`` (extra ``key=value`` words are ignored);
  ``#`` starts a comment; blank lines are skipped.
"""
import dataclasses
import functools
import socket

from tfring.runner import rank_wrapper

# Names that always mean "this machine", so they never need a DNS lookup.
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "localhost.localdomain"}


class HostSpecError(ValueError):
    """A host list that cannot be parsed; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int

    def __str__(self):
        return f"{self.name}:{self.slots}"


def _slots(text, where):
    try:
        slots = int(text)
    except ValueError:
        raise HostSpecError(f"{where}: slots must be a whole number, got {text!r}") from None
    if slots < 1:
        raise HostSpecError(f"{where}: slots must be at least 1, got {slots}")
    return slots


def _host_colon_slots(item, where):
    """Parses ``host`` or ``host:slots`` (an IPv6 address needs the slots form)."""
    name, sep, slots = item.rpartition(":")
    if not sep or ":" in name and not name.startswith("["):
        # "host" alone, or a bare IPv6 address such as ::1.
        name, slots = item, "1"
    name = name.strip("[]")
    if not name:
        raise HostSpecError(f"{where}: empty host name in {item!r}")
    return Host(name, _slots(slots, where))


def parse_hosts_arg(text):
    """Parses the value of ``-H``/``--hosts``, e.g. ``"a:4,b:4"``."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise HostSpecError("-H: no hosts given")
    return _merge([_host_colon_slots(item, f"-H {text}") for item in items if item])


def parse_hostfile_text(text, filename="hostfile"):
    """Parses hostfile contents (see the module docstring for the syntax)."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{filename}:{number}"
        words = line.split()
        host = _host_colon_slots(words[0], where)
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if not sep:
                raise HostSpecError(f"{where}: expected key=value after the host, got {word!r}")
            if key == "slots":
                host = Host(host.name, _slots(value, where))
        hosts.append(host)
    if not hosts:
        raise HostSpecError(f"{filename}: no hosts listed")
    return _merge(hosts)


def parse_hostfile(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise HostSpecError(f"cannot read hostfile {path}: {e.strerror}") from None
    return parse_hostfile_text(text, path)


def _merge(hosts):
    """Adds up repeated hosts, keeping first-seen order.

    hydra would otherwise treat ``a:2,a:2`` as two separate proxies on the same
    machine, which breaks local_rank/local_size.
    """
    slots = {}
    for host in hosts:
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return [Host(name, n) for name, n in slots.items()]


def total_slots(hosts):
    return sum(host.slots for host in hosts)


def assign_ranks(hosts, num_proc):
    """Returns {host name: [ranks]} for ``num_proc`` ranks filling slots in order."""
    placement, rank = {}, 0
    for host in hosts:
        take = min(host.slots, num_proc - rank)
        if take <= 0:
            break
        placement[host.name] = list(range(rank, rank + take))
        rank += take
    return placement


@functools.lru_cache(maxsize=None)
def _local_addresses():
    names = {socket.gethostname(), socket.getfqdn()}
    addresses = set()
    for name in names:
        try:
            addresses.update(info[4][0] for info in socket.getaddrinfo(name, None))
        except OSError:
            pass
    return names, addresses


def is_local(name):
    """True when ``name`` is this machine, so its ranks need no ssh.

    Loopback names are decided without DNS; other names are compared with this
    machine's host names and the addresses they resolve to.
    """
    if name in _LOOPBACK_NAMES:
        return True
    names, addresses = _local_addresses()
    if name in names:
        return True
    try:
        resolved = {info[4][0] for info in socket.getaddrinfo(name, None)}
    except OSError:
        return False
    return any(a.startswith("127.") or a == "::1" or a in addresses for a in resolved)


def interface_address(interface):
    """IPv4 address of a network interface such as ``eth0`` on this host (Linux only).

    Raises:
        HostSpecError: no such interface here, or it has no IPv4 address.
    """
    try:
        return rank_wrapper.interface_address(interface)
    except OSError as e:
        raise HostSpecError(f"network interface {interface!r}: {e.strerror or e}") from None


def address_seen_from(remote_names, interface=None):
    """An address of this machine that the given remote hosts can connect to.

    With an interface, its address. Otherwise the source address the kernel
    would route from towards the first remote host that resolves (a UDP
    "connect" sends nothing), falling back to this host name's address.
    """
    if interface:
        return interface_address(interface)
    for name in remote_names:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((name, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return socket.gethostbyname(socket.gethostname())
