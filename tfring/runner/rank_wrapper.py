"""Runs one rank's command for tfringrun and reports how it ended.

tfringrun starts every rank as::

    python .../tfring/runner/rank_wrapper.py --launcher HOST:PORT \\
        [--prefix] [--output-dir DIR] [--grace S] [--env-stdin] -- command args...

under ``mpiexec`` (MPI), or itself (TCP: locally as a subprocess, remotely
over ssh), with the job's token in ``TFRING_LAUNCHER_TOKEN`` (in the
environment, not in argv, where every user's ``ps`` would show it; the
wrapper removes it before starting the command). Over ssh the environment,
token and TCP secret included, comes as one JSON object on stdin
(``--env-stdin``), since a remote command line is just as visible. Under TCP
the rank is ``TFRING_RANK``, and ``TFRING_NETWORK_INTERFACES`` is
turned into this host's ``TFRING_BIND_HOST``. The wrapper is needed
because hydra (MPICH's mpiexec) neither tells its caller which rank failed
nor ends the job when a rank that never called MPI_Init exits non-zero: the
other ranks run on. The wrapper

* connects back to tfringrun over TCP and says ``hello`` (so tfringrun knows
  the rank started, and its pid and host),
* runs the command as a child in the wrapper's own process group (hydra
  setsid()s each rank, so whatever it sends to that group reaches the
  command and everything the command started), with hydra's PMI file
  descriptors inherited so MPI_Init works in the child, and with a
  parent-death signal so that even a SIGKILLed wrapper takes its command
  with it,
* passes the child's output on in whole lines, so that ranks' lines never
  cut into each other, optionally prefixed with ``[rank]<stdout>:`` (Horovod's
  format), and copies it raw to ``DIR/rank.N/stdout`` and ``stderr``,
* forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to the child,
* ends the rank (SIGTERM to every process of its group, then SIGKILL to
  those left after ``--grace`` seconds) when tfringrun sends ``stop`` or
  when the connection drops, which is how a killed tfringrun still leaves
  no stray ranks behind. The whole group, not just the child: a rank
  command that is a script (``bash -c "python train.py"``) would otherwise
  leave its python running after the shell died. When the child ends by
  itself, whatever it left running in the group is ended the same way,
* sends ``exit RANK CODE`` (CODE < 0 means killed by signal -CODE) and exits
  with the child's code (128+N for signal N). A wrapper whose child failed,
  or that was told to stop, first waits for ``release``: see
  :meth:`RankWrapper.run` for why.

This file is run by path and imports only the standard library, so the ranks
start fast and do not depend on how ``tfring`` is installed on each host. The
wire format is defined here and parsed by :mod:`tfring.runner.supervisor`.
"""
import argparse
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

# Wire format, one ASCII line per message.
HELLO = "hello"   # wrapper -> launcher: hello TOKEN RANK PID HOST
EXIT = "exit"     # wrapper -> launcher: exit RANK CODE   (CODE < 0: killed by signal -CODE)
STOP = "stop"     # launcher -> wrapper: end the command now
RELEASE = "release"  # launcher -> wrapper: every rank has reported its end; exit now
# How tfringrun hands the job token to the wrappers.
TOKEN_ENV = "TFRING_LAUNCHER_TOKEN"
# The rank tfringrun placed here, when no MPI launcher numbers the ranks (TCP).
RANK_ENV = "TFRING_RANK"
# Interface names whose address (on the rank's own host) the rank listens on.
INTERFACES_ENV = "TFRING_NETWORK_INTERFACES"
BIND_ENV = "TFRING_BIND_HOST"
# An environment on stdin larger than this is refused, not read without bound.
_MAX_ENV_BYTES = 16 << 20

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                     signal.SIGUSR1, signal.SIGUSR2)
# A line longer than this without a newline is written out anyway, so one
# rank cannot make the wrapper buffer without bound.
_MAX_LINE = 1 << 16
# Seconds a partial line waits for its newline before it is written anyway.
_IDLE_FLUSH = 0.5
_PR_SET_PDEATHSIG = 1


def _say(message):
    # One write for the line and its newline, as tfring.runner.console.say
    # does (this file imports only the standard library): a print() writes
    # them apart, and another rank's line could land between.
    sys.stderr.write(f"tfringrun: {message}\n")
    sys.stderr.flush()


def rank_from_env(env=os.environ):
    """This process's rank as the MPI launcher exported it, or None."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return None


def launcher_rank(env=os.environ):
    """The rank as an MPI launcher numbered it, else as tfringrun placed it
    (``TFRING_RANK``), else None."""
    rank = rank_from_env(env)
    if rank is None and env.get(RANK_ENV, "").isdigit():
        rank = int(env[RANK_ENV])
    return rank


def read_environment(stream):
    """The environment tfringrun sent on stdin: one JSON object of strings.

    Raises:
        ValueError: it is not one, or larger than 16 MiB.
    """
    data = stream.read(_MAX_ENV_BYTES + 1)
    if len(data) > _MAX_ENV_BYTES:
        raise ValueError(f"the environment on stdin exceeds {_MAX_ENV_BYTES} bytes")
    try:
        env = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"the environment on stdin is not JSON: {e}") from None
    if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k
            for k, v in env.items()):
        raise ValueError("the environment on stdin is not an object of string variables")
    return env


def interface_address(interface):
    """IPv4 address of a network interface such as ``eth0`` (Linux only).

    Raises:
        OSError: no such interface, or it has no IPv4 address.
    """
    import fcntl
    import struct
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), siocgifaddr,
                             struct.pack("256s", interface[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


def resolve_bind_host(env):
    """Sets ``TFRING_BIND_HOST`` in `env` from ``TFRING_NETWORK_INTERFACES``
    (the first listed interface this host has), unless it is set already.
    Interfaces are resolved here, on the rank's host: the same name has a
    different address on every host.

    Raises:
        OSError: none of the interfaces exists here.
    """
    names = [n.strip() for n in env.get(INTERFACES_ENV, "").split(",") if n.strip()]
    if not names or env.get(BIND_ENV):
        return
    errors = []
    for name in names:
        try:
            env[BIND_ENV] = interface_address(name)
            return
        except OSError as e:
            errors.append(f"{name}: {e.strerror or e}")
    raise OSError(f"none of --network-interfaces {','.join(names)} has an IPv4 address on "
                  f"{socket.gethostname()} ({'; '.join(errors)})")


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="rank_wrapper", allow_abbrev=False)
    parser.add_argument("--launcher", help="HOST:PORT of tfringrun's status listener")
    parser.add_argument("--prefix", action="store_true", help="prefix output lines with the rank")
    parser.add_argument("--output-dir", help="also write output to DIR/rank.N/{stdout,stderr}")
    parser.add_argument("--grace", type=float, default=3.0,
                        help="seconds between SIGTERM and SIGKILL when stopping")
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    parser.add_argument("--env-stdin", action="store_true",
                        help="read the rank's environment from stdin, one JSON object")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    return args


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


class _Pump(threading.Thread):
    """Copies one of the child's output pipes to our own fd, whole lines at a time.

    hydra merges all ranks' output chunk by chunk, and an unbuffered Python
    writes the pieces of one print() separately, so passing bytes straight
    through lets ranks' lines cut into each other. Writing whole lines (each
    with the rank prefix, if any) keeps them intact. A partial line (a
    prompt, a progress bar) is written out after ``_IDLE_FLUSH`` seconds
    without more output, and its rest then follows without a second prefix.
    """

    def __init__(self, src, dst_fd, prefix, log_path):
        super().__init__(daemon=True)
        self.src, self.dst_fd, self.prefix = src, dst_fd, prefix
        self.log = open(log_path, "wb", buffering=0) if log_path else None
        self.dst_ok = True
        self.mid_line = False  # a partial line has been written without its newline

    def _emit(self, data):
        if self.dst_ok and data:
            try:
                _write_all(self.dst_fd, data)
            except OSError:
                # Our reader (hydra) is gone; keep draining so the child never blocks.
                self.dst_ok = False

    def _lines(self, lines):
        """Prefixed bytes for complete lines, continuing a partial one if open."""
        head = b"" if self.mid_line else self.prefix
        self.mid_line = False
        return head + (b"\n" + self.prefix).join(lines) + b"\n"

    def _partial(self, data):
        head = b"" if self.mid_line else self.prefix
        self.mid_line = True
        return head + data

    def run(self):
        pending = b""
        fd = self.src.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], _IDLE_FLUSH if pending else None)
            if not ready:
                self._emit(self._partial(pending))
                pending = b""
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            if self.log:
                self.log.write(data)
            *lines, pending = (pending + data).split(b"\n")
            out = self._lines(lines) if lines else b""
            if len(pending) > _MAX_LINE:
                out += self._partial(pending)
                pending = b""
            self._emit(out)
        if pending or self.mid_line:
            self._emit(self._lines([pending]))
        if self.log:
            self.log.close()


def _die_with_parent():
    """Runs in the child before exec: SIGKILL it if the wrapper itself dies.

    Covers the one case the wrapper cannot handle itself, being SIGKILLed.
    """
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the wrapper died before prctl took effect
        os._exit(1)


def _lead_own_group():
    """Makes the wrapper the leader of its own process group; returns the group id.

    Under hydra it already is (hydra setsid()s each rank). Run any other way,
    it would share its caller's group, and ending "the rank's group" would
    end the caller too.
    """
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)
    return os.getpid()


def _group_members(pgid):
    """Live processes of process group `pgid` other than this one, from /proc;
    None where there is no /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    me, members = os.getpid(), []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # The command name is in parentheses and may contain spaces.
                state, _ppid, pgrp = f.read().rpartition(b")")[2].split()[:3]
        except (OSError, ValueError):
            continue
        # A zombie has already ended; only its parent can make it go away.
        if int(pgrp) == pgid and state not in (b"Z", b"X"):
            members.append(int(entry))
    return members


class RankWrapper:
    def __init__(self, args, rank, token=""):
        self.args, self.rank, self.token = args, rank, token
        self.pgid = None
        self.child = None
        self.sock = None
        # Re-entrant: the signal handler runs on the main thread, possibly while
        # that thread already holds the lock in start_child().
        self.lock = threading.RLock()
        self.stop_requested = False
        self.kill_at = None  # when a stop turns from SIGTERM to SIGKILL
        self.stop_received = threading.Event()
        self.released = threading.Event()
        self.pending_signals = []

    # -- launcher connection -------------------------------------------------
    def connect(self):
        host, _, port = self.args.launcher.rpartition(":")
        deadline = time.monotonic() + self.args.connect_timeout
        while True:
            try:
                self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise OSError(f"cannot reach tfringrun at {self.args.launcher}: {e}") from e
                time.sleep(0.2)
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def send(self, *words):
        if self.sock is None:
            return
        try:
            self.sock.sendall((" ".join(str(w) for w in words) + "\n").encode())
        except OSError:
            pass

    def listen(self):
        """Handles ``stop`` and ``release`` from tfringrun until either
        ``release`` comes or the connection drops."""
        try:
            for line in self.sock.makefile("rb"):
                word = line.strip().decode(errors="replace")
                if word == STOP:
                    self.stop_received.set()
                    self.request_stop()
                elif word == RELEASE:
                    break
        except (OSError, ValueError):
            pass
        # Released, or tfringrun is gone (then nobody else will stop the rank).
        self.stop_received.set()
        self.released.set()
        self.request_stop()

    # -- child control ---------------------------------------------------------
    def on_signal(self, signum, _frame):
        with self.lock:
            if self.child is None:
                self.pending_signals.append(signum)
                return
            self._signal_child(signum)

    def _signal_child(self, signum):
        try:
            self.child.send_signal(signum)
        except OSError:
            pass

    def _signal_group(self, signum):
        """Sends `signum` to every process of the rank's group but the wrapper;
        returns whether any was left to signal."""
        members = None if self.pgid is None else _group_members(self.pgid)
        if members is None:  # no /proc: the child is all we know of
            if self.child is None or self.child.poll() is not None:
                return False
            self._signal_child(signum)
            return True
        for pid in members:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        return bool(members)

    def _begin_stop(self):
        """SIGTERMs the group, once; the SIGKILL follows at self.kill_at."""
        with self.lock:
            if self.stop_requested:
                return False
            self.stop_requested = True
            self.kill_at = time.monotonic() + self.args.grace
            self._signal_group(signal.SIGTERM)
            return True

    def _kill_group(self):
        """SIGKILLs the group until no process of it is left (or 5 s passed:
        one stuck in the kernel cannot be helped)."""
        deadline = time.monotonic() + 5.0
        while self._signal_group(signal.SIGKILL) and time.monotonic() < deadline:
            time.sleep(0.02)

    def request_stop(self):
        """SIGTERM the rank's group now and SIGKILL what is left after the grace period."""
        with self.lock:
            if self.child is None or not self._begin_stop():
                return
        timer = threading.Timer(self.args.grace, self._kill_group)
        timer.daemon = True
        timer.start()

    def _end_group(self):
        """After the child ended: ends whatever it left running in the group
        (a script's own children, say), SIGTERM first, SIGKILL after the grace."""
        if self.pgid is None or not _group_members(self.pgid):
            return
        self._begin_stop()
        while _group_members(self.pgid) and time.monotonic() < self.kill_at:
            time.sleep(0.05)
        self._kill_group()

    def start_child(self):
        logs = {}
        if self.args.output_dir:
            rank_dir = os.path.join(self.args.output_dir, f"rank.{self.rank}")
            os.makedirs(rank_dir, exist_ok=True)
            logs = {name: os.path.join(rank_dir, name) for name in ("stdout", "stderr")}
        with self.lock:
            # close_fds=False keeps hydra's inheritable PMI descriptors (PMI_FD,
            # HYDI_CONTROL_FD) open in the child; Python's own fds, such as the
            # launcher socket, are non-inheritable and are not passed on.
            self.child = subprocess.Popen(
                self.args.command, close_fds=False, preexec_fn=_die_with_parent,
                stdin=subprocess.DEVNULL if self.args.env_stdin else None,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for signum in self.pending_signals:
                self._signal_child(signum)
        pumps = []
        for name, src, fd in (("stdout", self.child.stdout, 1), ("stderr", self.child.stderr, 2)):
            prefix = f"[{self.rank}]<{name}>:".encode() if self.args.prefix else b""
            pumps.append(_Pump(src, fd, prefix, logs.get(name)))
        for pump in pumps:
            pump.start()
        return pumps

    def run(self):
        self.pgid = _lead_own_group()
        for signum in FORWARDED_SIGNALS:
            signal.signal(signum, self.on_signal)
        if self.args.launcher:
            try:
                self.connect()
            except OSError as e:
                _say(f"rank {self.rank}: {e}")
                return 1
        try:
            pumps = self.start_child()
        except OSError as e:
            _say(f"rank {self.rank}: cannot run {self.args.command[0]!r}: {e.strerror}")
            code = 127 if isinstance(e, FileNotFoundError) else 126
            self.send(HELLO, self.token, self.rank, os.getpid(), socket.gethostname())
            self.send(EXIT, self.rank, code)
            return code
        self.send(HELLO, self.token, self.rank, os.getpid(), socket.gethostname())
        if self.sock is not None:
            threading.Thread(target=self.listen, daemon=True).start()
        code = self.child.wait()
        # The rank is over only when nothing it started is left.
        self._end_group()
        for pump in pumps:
            # A process outside the group that inherited the pipe can hold it
            # open forever.
            pump.join(timeout=2.0)
        self.send(EXIT, self.rank, code)
        if self.sock is not None and (code != 0 or self.stop_received.is_set()):
            # hydra SIGKILLs every rank as soon as one process it started
            # exits without MPI_Finalize, which a failed or stopped rank
            # usually does. Exiting now would kill the other ranks before
            # they could end by themselves, report their exit to tfringrun,
            # or (after a failure) name the dead rank in their own errors.
            # tfringrun says "release" once every rank has reported, or
            # stops the job; a dropped connection also releases.
            self.released.wait()
        if self.sock is not None:
            self.sock.close()
        return code


def exit_status(code):
    """The wrapper's own exit status for the child's return code.

    A child killed by signal N gives the shell's 128+N. The wrapper does not
    die of the same signal itself: tfringrun already knows the real cause
    from the ``exit`` message, and a signal death would only make hydra print
    its "BAD TERMINATION" banner and SIGKILL the other ranks before tfringrun
    could stop them gracefully.
    """
    return code if code >= 0 else 128 - code


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.env_stdin:
            os.environ.update(read_environment(sys.stdin.buffer))
        resolve_bind_host(os.environ)
    except (OSError, ValueError) as e:
        rank = launcher_rank()
        _say(f"rank {'?' if rank is None else rank}: {e}")
        return 1
    rank = launcher_rank()
    # Taken out of the environment so the command does not inherit it.
    token = os.environ.pop(TOKEN_ENV, "")
    wrapper = RankWrapper(args, "?" if rank is None else rank, token)
    return exit_status(wrapper.run())


if __name__ == "__main__":
    if not __package__:
        # Run by path: drop this directory from sys.path so that sibling
        # modules can never shadow standard-library ones.
        sys.path.pop(0)
    sys.exit(main())
