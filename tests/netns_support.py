"""Fake hosts with network stacks of their own, for multi-host tests on one
machine.

Each fake host is a network namespace with one veth link to a bridge in the
root namespace; the bridge holds the address the rendezvous store (started
by the test or tfringrun in the root namespace) listens on. A rank started in
a fake host (through the fake ``ssh`` that :meth:`FakeHosts.ssh_command`
writes) has its own address, its own loopback and its own host name (a UTS
namespace), so a cross-host ring really crosses an interface, and
:meth:`FakeHosts.cut` takes a host off the network as a pulled cable would.

Everything is created under names unique to this object and removed on
exit, processes inside the namespaces included. Needs root and ``ip``;
:func:`available` says whether this machine allows it.
"""
import itertools
import os
import re
import shutil
import signal
import stat
import subprocess
import textwrap
import time

_counter = itertools.count()


def _ip(*args, netns=None, check=True):
    cmd = ["ip", *(("netns", "exec", netns, "ip") if netns else ()), *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def _tc(*args, netns=None, check=True):
    cmd = [*(("ip", "netns", "exec", netns) if netns else ()), "tc", *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def available():
    """True when this process may create network namespaces and links."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        return False
    name = f"tfrprobe{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (subprocess.CalledProcessError, OSError):
        return False
    _ip("netns", "del", name, check=False)
    return True


def _base36(n):
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, d = divmod(n, 36)
        out = digits[d] + out
        if n == 0:
            return out


# Every FakeHosts on the machine takes a /24 of its own for its bridge. Two
# test processes (two xdist workers, two checkouts' runs) choose at the same
# time, so the choice and the bridge's address are made under this lock,
# and a subnet any interface already has is never chosen.
SUBNET_LOCK = "/tmp/tfring-fake-hosts.lock"


def _used_subnets():
    out = _ip("-o", "-4", "addr", "show").stdout
    return {m.group(1) for m in re.finditer(r"inet (\d+\.\d+\.\d+)\.\d+/", out)}


def _free_subnet():
    used = _used_subnets()
    start = os.getpid() % 50 * 250
    for i in range(50 * 250):
        k = (start + i) % (50 * 250)
        subnet = f"10.{200 + k // 250}.{k % 250}"
        if subnet not in used:
            return subnet
    raise RuntimeError("no free 10.200-249.x.0/24 subnet for fake hosts")


class FakeHosts:
    """``with FakeHosts(["a", "b"]) as hosts:`` creates the namespaces of
    fake hosts named a and b (the names ranks see as their host names)."""

    def __init__(self, names):
        self.names = list(names)
        # Unique on the machine while this process lives: its pid and a
        # count (base 36, so that a veth's name, with its "h" or "n", stays
        # within the kernel's 15 characters).
        tag = _base36(os.getpid()) + "-" + _base36(next(_counter))
        self.bridge = f"tfrb{tag}"
        self._ns = {n: f"tfrns{tag}-{i}" for i, n in enumerate(self.names)}
        self._veth = {n: f"tfv{tag}-{_base36(i)}" for i, n in enumerate(self.names)}
        assert all(len(v) <= 14 for v in self._veth.values()) and len(self.bridge) <= 15
        self.subnet = self.root_address = None
        self._addr = {}
        self._dir = None

    def __enter__(self):
        import fcntl
        try:
            with open(SUBNET_LOCK, "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.subnet = _free_subnet()
                self.root_address = f"{self.subnet}.254"
                self._addr = {n: f"{self.subnet}.{i + 1}" for i, n in enumerate(self.names)}
                _ip("link", "add", self.bridge, "type", "bridge")
                _ip("addr", "add", f"{self.root_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name in self.names:
                ns, veth = self._ns[name], self._veth[name]
                _ip("netns", "add", ns)
                _ip("link", "add", veth + "h", "type", "veth", "peer", "name", veth + "n")
                _ip("link", "set", veth + "n", "netns", ns)
                _ip("link", "set", veth + "h", "master", self.bridge, "up")
                _ip("addr", "add", f"{self._addr[name]}/24", "dev", veth + "n", netns=ns)
                _ip("link", "set", veth + "n", "up", netns=ns)
                _ip("link", "set", "lo", "up", netns=ns)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def address(self, name):
        """The fake host's own address."""
        return self._addr[name]

    def interface(self, name):
        """The name of fake host `name`'s network interface (inside it)."""
        return self._veth[name] + "n"

    def interfaces(self):
        """For --network-interfaces: the bridge (where the launcher and its
        store listen) and every fake host's own interface, so that each
        host finds the one it has."""
        return ",".join([self.bridge] + [self.interface(n) for n in self.names])

    def namespace(self, name):
        return self._ns[name]

    def traffic(self, name):
        """Bytes fake host `name`'s link has carried so far, both ways."""
        stats = f"/sys/class/net/{self._veth[name]}h/statistics/"
        return sum(int(open(stats + f).read()) for f in ("rx_bytes", "tx_bytes"))

    def restore(self, name):
        """Puts `name` back on the network after :meth:`cut`."""
        _ip("link", "set", self._veth[name] + "h", "up")

    def cut(self, name):
        """Takes `name` off the network: its link goes down, its processes
        live on (nothing closes their sockets)."""
        _ip("link", "set", self._veth[name] + "h", "down")

    def shape(self, rate, burst="512kb"):
        """Limits every fake host's link to `rate` (a tc rate: "1gbit",
        "2500mbit") in each direction, as a NIC of that speed would: a token
        bucket (tbf) on both ends of its veth, the host side shaping what
        reaches the host and the namespace side what leaves it. The qdiscs
        go with the veths on exit. (netem, for added latency, is not in
        every kernel; tbf is.)"""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "100ms"]
        for name in self.names:
            ns, veth = self._ns[name], self._veth[name]
            _tc("qdisc", "replace", "dev", veth + "h", *tbf)
            _tc("qdisc", "replace", "dev", veth + "n", *tbf, netns=ns)

    def shaping(self, name):
        """The tbf rates on fake host `name`'s two veth ends as `tc` prints
        them (["1Gbit", "1Gbit"]); [] when unshaped."""
        ns, veth = self._ns[name], self._veth[name]
        shown = _tc("qdisc", "show", "dev", veth + "h").stdout + \
            _tc("qdisc", "show", "dev", veth + "n", netns=ns).stdout
        return re.findall(r"qdisc tbf .*?rate (\S+)", shown)

    def link_bytes(self):
        """Bytes that have crossed between the fake hosts (and the bridge)
        so far: each is counted leaving one host's veth and entering
        another's, hence the half."""
        total = 0
        for name in self.names:
            for way in ("tx", "rx"):
                with open(f"/sys/class/net/{self._veth[name]}h/statistics/{way}_bytes") as f:
                    total += int(f.read())
        return total // 2

    def command(self, name, argv):
        """`argv` run inside fake host `name`, under its host name."""
        script = 'hostname "$0" && exec "$@"'
        return ["ip", "netns", "exec", self._ns[name], "unshare", "--uts", "sh", "-c", script,
                name, *argv]

    def ssh_command(self, directory):
        """Writes an ``ssh`` that runs its command inside the named fake host
        (accepting the options tfringrun passes: -p PORT, -i FILE, -o OPT)
        into `directory` and returns its path; put `directory` first on PATH."""
        table = "\n".join(f"  {name}) ns={self._ns[name]} ;;" for name in self.names)
        body = textwrap.dedent("""\
            #!/bin/sh
            # A fake ssh for tests: runs the remote command in a network namespace.
            while [ $# -gt 0 ]; do
              case "$1" in
                -p|-i|-o|-l) shift 2 ;;
                -*) shift ;;
                *) break ;;
              esac
            done
            host="$1"; shift
            case "$host" in
            {table}
              *) echo "fake ssh: no such host: $host" >&2; exit 255 ;;
            esac
            exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
            """).replace("{table}", table.strip())
        path = os.path.join(directory, "ssh")
        with open(path, "w") as f:
            f.write(body)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def _pids(self, ns):
        out = _ip("netns", "pids", ns, check=False).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def __exit__(self, *exc):
        # Nothing started inside may outlive the test.
        for ns in self._ns.values():
            for pid in self._pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 5
        while time.time() < deadline and any(self._pids(ns) for ns in self._ns.values()):
            time.sleep(0.05)
        for name in self.names:
            _ip("link", "del", self._veth[name] + "h", check=False)
            _ip("netns", "del", self._ns[name], check=False)
        _ip("link", "del", self.bridge, check=False)
        return False
