"""Watches a running job: which ranks started, which ended and how, and stops it.

hydra alone is not enough to run a job well:

* it does not say which rank failed or with which code;
* when a rank that never called MPI_Init (or one that is stuck before it)
  exits non-zero, hydra keeps the other ranks running, possibly for ever;
* a killed mpiexec can leave ranks behind.

So every rank runs under :mod:`tfring.runner.rank_wrapper`, which connects
back to a TCP listener here, says ``hello`` when its command has started and
``exit RANK CODE`` when it ends. The supervisor runs mpiexec in its own
session (so a terminal's Ctrl-C reaches only tfringrun, which then stops the
job in order) and loops until mpiexec exits:

* the first rank that exits non-zero (or dies of a signal) is reported on
  stderr and the job is stopped;
* ``--timeout`` expiring, ranks that have not started within
  ``--start-timeout``, and SIGINT/SIGTERM/SIGHUP on tfringrun also stop it.

Stopping sends ``stop`` to every wrapper (each SIGTERMs its rank's process
group and SIGKILLs what is left after the grace period), SIGTERMs mpiexec
if some rank has not connected yet, and, if processes remain after the
grace period plus a margin, SIGKILLs mpiexec and every process under it. A
second Ctrl-C skips straight to that. If tfringrun itself is killed, the
wrappers see their connection drop and stop their commands, so no rank
outlives the job.

A wrapper whose rank failed or was stopped does not exit until it gets
``release``, sent once no rank is running any more: hydra SIGKILLs every
rank when one of its processes exits without MPI_Finalize, and an early
exit would kill the others before they reported how they ended. Once the
job is stopping, every rank's end is reported (with --verbose, always).

While the job runs, the supervisor notes which MPI shared-memory files its
ranks on this host have mapped; when the job is over, those that no
process maps any more are removed (see :mod:`tfring.runner.shm_cleanup`).
"""
import hmac
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time

from tfring.runner import rank_wrapper as wire
from tfring.runner import shm_cleanup

GRACE_SECONDS = 3.0
# After a rank fails, the others get this long to notice (tfring names the
# dead rank in their errors) and exit by themselves before they are stopped.
FAILURE_GRACE_SECONDS = 5.0
_KILL_MARGIN = 2.0
_POLL_SECONDS = 0.1
_DRAIN_SECONDS = 1.0
# How often the ranks' mapped shared-memory files are noted while nothing
# happens; every start of a stop and every rank's end also note them.
_SHM_SCAN_SECONDS = 2.0
# Signals that usually mean "stopped because another rank failed", so a rank
# that ended with an ordinary non-zero code at the same moment is the cause.
_COLLATERAL = {signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE}


def format_ranks(ranks):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)


def describe_exit(code):
    """A wrapper's exit CODE as (words for the message, shell exit code).

    3 -> ("exited with code 3", 3); -9 -> ("was killed by signal 9 (SIGKILL)", 137).
    """
    if code >= 0:
        return f"exited with code {code}", code
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}", 128 - code


def _process_table():
    """{pid: (ppid, process group)} of every live process, from /proc (empty elsewhere)."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # The command name is in parentheses and may contain spaces.
                fields = f.read().rpartition(b")")[2].split()
            if fields[0] not in (b"Z", b"X"):
                table[int(entry)] = (int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def _descendants(roots, table=None):
    """Pids of every process under any of ``roots``."""
    table = _process_table() if table is None else table
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class _Rank:
    def __init__(self):
        self.host = None
        self.pid = None
        self.code = None  # None while running


class _Connection:
    def __init__(self, sock):
        self.sock = sock
        self.buffer = b""
        self.rank = None
        self.released = False


class Supervisor:
    """Runs one mpiexec job and turns what the wrappers report into an exit code."""

    def __init__(self, num_proc, *, bind_host="127.0.0.1", advertise_host="127.0.0.1",
                 start_timeout=30.0, timeout=None, verbose=False, show_hosts=False,
                 grace=GRACE_SECONDS, failure_grace=FAILURE_GRACE_SECONDS):
        self.num_proc = num_proc
        self.start_timeout = start_timeout
        self.timeout = timeout
        self.verbose = verbose
        self.show_hosts = show_hosts
        self.grace = grace
        self.failure_grace = failure_grace
        self.deferred_stop = None  # when a stop delayed by failure_grace happens
        self.token = secrets.token_hex(16)
        self.listener = socket.create_server((bind_host, 0))
        self.listener.setblocking(False)
        self.address = f"{advertise_host}:{self.listener.getsockname()[1]}"
        self.ranks = {r: _Rank() for r in range(num_proc)}
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.connections = []
        self.proc = None
        self.outcome = None        # (exit code, message) of what ended the job
        self.stop_deadline = None  # when the hard kill happens
        self.killed = False
        self.signals = []
        self.hostname = socket.gethostname()
        self.shm_paths = set()     # MPI shared-memory files the ranks here have mapped
        self.shm_removed = []      # those removed after the job
        self.shm_left = []         # those still mapped by some process after the job
        self.next_shm_scan = 0.0

    def wrapper_args(self):
        """Arguments that point each rank wrapper back at this supervisor.

        The token is not among them: :meth:`run` passes it in the
        environment, so that ``ps`` does not show it to every user.
        """
        return ["--launcher", self.address, "--grace", str(self.grace),
                "--connect-timeout", str(self.start_timeout)]

    # -- reporting ---------------------------------------------------------
    def _say(self, message):
        print(f"tfringrun: {message}", file=sys.stderr, flush=True)

    def _rank_name(self, rank):
        host = self.ranks[rank].host
        return f"rank {rank} (on {host})" if self.show_hosts and host else f"rank {rank}"

    def _running(self):
        return [r for r, s in self.ranks.items() if s.pid is not None and s.code is None]

    def _not_started(self):
        return [r for r, s in self.ranks.items() if s.pid is None and s.code is None]

    def _report_end(self, rank, code):
        # Once the job is stopping, a user (who may have pressed Ctrl-C)
        # sees how every rank ended; before that only with --verbose, as
        # the first failure gets its own message.
        if self.verbose or self.outcome is not None:
            self._say(f"{self._rank_name(rank)} {describe_exit(code)[0]}")

    # -- the job's processes on this host ----------------------------------
    def _local_processes(self):
        """Pids of the job's processes on this host: everything under
        mpiexec, and every member of a running rank's process group (a
        process the rank's command started stays in it after its parent
        died)."""
        groups = {s.pid for s in self.ranks.values()
                  if s.pid is not None and s.code is None and s.host == self.hostname}
        table = _process_table()
        pids = set(_descendants([self.proc.pid], table))
        pids.update(pid for pid, (_, pgrp) in table.items() if pgrp in groups)
        return pids

    def _note_shm(self):
        """Notes the MPI shared-memory files the job's processes here map now."""
        self.next_shm_scan = time.monotonic() + _SHM_SCAN_SECONDS
        if self.proc is not None:
            self.shm_paths |= shm_cleanup.mapped_segments(self._local_processes())

    # -- wrapper messages --------------------------------------------------
    def _accept(self):
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        conn = _Connection(sock)
        self.connections.append(conn)
        self.selector.register(sock, selectors.EVENT_READ, conn)

    def _close(self, conn):
        self.selector.unregister(conn.sock)
        conn.sock.close()
        self.connections.remove(conn)

    def _read(self, conn, exits):
        try:
            data = conn.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            if conn.rank is not None and self.ranks[conn.rank].code is None:
                # The wrapper died without reporting: treat as killed.
                self.ranks[conn.rank].code = -signal.SIGKILL
                exits.append((conn.rank, -signal.SIGKILL))
                if self.verbose or self.outcome is not None:
                    self._say(f"{self._rank_name(conn.rank)} ended without reporting how "
                              "(its wrapper was killed); counted as killed by SIGKILL")
            return
        conn.buffer += data
        *lines, conn.buffer = conn.buffer.split(b"\n")
        for line in lines:
            self._handle(conn, line.decode(errors="replace").split(), exits)

    def _handle(self, conn, words, exits):
        if conn.rank is None:
            # The first message must be a hello with our token: anything else
            # is a stray connection, not one of this job's ranks.
            if (len(words) != 5 or words[0] != wire.HELLO
                    or not hmac.compare_digest(words[1].encode(), self.token.encode())
                    or not words[2].isdigit() or int(words[2]) not in self.ranks):
                self._close(conn)
                return
            conn.rank = int(words[2])
            state = self.ranks[conn.rank]
            state.pid, state.host = int(words[3]), words[4]
            if self.verbose:
                self._say(f"rank {conn.rank} started on {state.host} (pid {state.pid})")
            if self.stop_deadline is not None:
                self._send_stop(conn)
        elif len(words) == 3 and words[0] == wire.EXIT and words[1] == str(conn.rank):
            try:
                code = int(words[2])
            except ValueError:
                return
            self.ranks[conn.rank].code = code
            exits.append((conn.rank, code))
            self._report_end(conn.rank, code)

    def _poll_wrappers(self, timeout):
        """Handles wrapper traffic; returns [(rank, code)] of ranks that just ended."""
        exits = []
        for key, _ in self.selector.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data, exits)
        return exits

    def _first_failure(self, exits):
        failed = [(r, c) for r, c in exits if c != 0]
        if not failed:
            return None
        # Messages on different connections that arrive together have no
        # order: prefer a real exit code over a signal a stop would send.
        failed.sort(key=lambda rc: rc[1] < 0 and -rc[1] in _COLLATERAL)
        return failed[0]

    # -- stopping ----------------------------------------------------------
    def _send(self, conn, word):
        try:
            conn.sock.sendall((word + "\n").encode())
        except OSError:
            pass

    def _send_stop(self, conn):
        self._send(conn, wire.STOP)

    def _release(self):
        """Lets waiting wrappers exit, once no rank is running any more."""
        if self._running():
            return
        for conn in self.connections:
            if conn.rank is not None and not conn.released:
                conn.released = True
                self._send(conn, wire.RELEASE)

    def _stop(self, code, message, delay=0.0):
        """Records why the job ends (first reason wins) and starts stopping it,
        after `delay` seconds if the ranks may still end by themselves."""
        if self.outcome is None:
            self.outcome = (code, message)
            self._say(message)
        if self.stop_deadline is not None:
            return
        if delay > 0 and self.proc.poll() is None:
            if self.deferred_stop is None:
                self.deferred_stop = time.monotonic() + delay
            return
        self.deferred_stop = None
        self._note_shm()  # before any rank is told to go
        self.stop_deadline = time.monotonic() + self.grace + _KILL_MARGIN
        for conn in list(self.connections):
            if conn.rank is not None:
                self._send_stop(conn)
        if self._not_started() and self.proc.poll() is None:
            # Ranks without a connection cannot be told; hydra passes SIGTERM on.
            self.proc.send_signal(signal.SIGTERM)

    def _kill_everything(self):
        """SIGKILLs mpiexec and every process under it, and this host's ranks."""
        if self.killed:
            return
        self.killed = True
        if self._running() or self._not_started():
            self._say(f"ranks {format_ranks(self._running() + self._not_started())} did not "
                      f"stop within {self.grace + _KILL_MARGIN:g} s; killing them")
        self._note_shm()
        victims = _descendants([self.proc.pid])
        for rank in self._running():
            state = self.ranks[rank]
            if state.host == self.hostname:
                try:
                    # The wrapper leads its own process group (hydra setsid()s
                    # each rank), which holds the command too.
                    os.killpg(state.pid, signal.SIGKILL)
                except OSError:
                    pass
        for pid in [self.proc.pid] + victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _on_signal(self, signum, _frame):
        self.signals.append(signum)

    def _check_deadlines(self, started_at):
        now = time.monotonic()
        while self.signals:
            signum = self.signals.pop(0)
            if self.stop_deadline is not None and signum == signal.SIGINT:
                self._say("second interrupt; killing the job now")
                self._kill_everything()
            self._stop(128 + signum, f"got {signal.Signals(signum).name}; stopping the job.")
        if self.timeout is not None and now - started_at > self.timeout:
            running = self._running() + self._not_started()
            self._stop(124, f"the job ran past --timeout {self.timeout:g} s; ranks still "
                            f"running: {format_ranks(running) or 'none'}; stopping the job.")
        if self._not_started() and now - started_at > self.start_timeout:
            self._stop(1, f"ranks {format_ranks(self._not_started())} did not start within "
                          f"--start-timeout {self.start_timeout:g} s (are the hosts reachable, "
                          "and is this Python and tfring installed at the same path on each?); "
                          "stopping the job.")
        if self.deferred_stop is not None and (now >= self.deferred_stop or not self._running()):
            # Grace is over, or every surviving rank has already ended.
            self._stop(*self.outcome)
        if self.stop_deadline is not None and now > self.stop_deadline:
            self._kill_everything()

    # -- main loop -----------------------------------------------------------
    def run(self, cmd, env=None):
        """Runs ``cmd`` (an mpiexec command line) and returns tfringrun's exit code.

        ``env`` is mpiexec's environment (default: this process's); the job
        token is added to it, and hydra passes it on to every rank.
        """
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        env = dict(os.environ if env is None else env, **{wire.TOKEN_ENV: self.token})
        try:
            self.proc = subprocess.Popen(cmd, env=env, start_new_session=True)
            return self._supervise()
        finally:
            # Every way out, an exception included, ends the job and cleans
            # up after it; signals meanwhile are only noted.
            try:
                if self.proc is not None and self.proc.poll() is None:
                    self._kill_everything()
                    self.proc.wait()
                if self.proc is not None:
                    self.shm_removed, self.shm_left = shm_cleanup.remove_leftovers(
                        self.shm_paths, wait=self.grace + _KILL_MARGIN)
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
                for conn in list(self.connections):
                    self._close(conn)
                self.selector.close()
                self.listener.close()

    def _supervise(self):
        started_at = time.monotonic()
        while self.proc.poll() is None:
            self._on_exits(self._poll_wrappers(_POLL_SECONDS))
            self._check_deadlines(started_at)
            if self._running() and time.monotonic() >= self.next_shm_scan:
                self._note_shm()
        mpiexec_code = self.proc.returncode
        # A wrapper's last message can still be in flight when mpiexec exits.
        drain_until = time.monotonic() + _DRAIN_SECONDS
        while self.connections and time.monotonic() < drain_until:
            self._on_exits(self._poll_wrappers(_POLL_SECONDS))
        if self.outcome is not None or self.verbose:
            self._report_unended()
        if self.outcome is not None:
            return self.outcome[0]
        if mpiexec_code != 0:
            missing = self._not_started()
            detail = f" before ranks {format_ranks(missing)} started" if missing else ""
            self._say(f"mpiexec exited with code {mpiexec_code}{detail}.")
            return mpiexec_code if mpiexec_code > 0 else 128 - mpiexec_code
        return 0

    def _report_unended(self):
        """Names the ranks whose end nobody reported, so that none is missing."""
        never = self._not_started()
        if never:
            self._say(f"ranks {format_ranks(never)} never started")
        silent = self._running()
        if silent:
            self._say(f"ranks {format_ranks(silent)} did not report how they ended")

    def _on_exits(self, exits):
        if exits:
            # The ranks still running map the job's shared memory now; once
            # they have all gone, nothing would show which files were its.
            if self._running():
                self._note_shm()
            self._release()
        failure = self._first_failure(exits)
        if failure is None or self.outcome is not None:
            return
        rank, code = failure
        what, shell_code = describe_exit(code)
        ending = "stopping the job." if self.proc.poll() is None else "the job has ended."
        self._stop(shell_code, f"{self._rank_name(rank)} {what}; {ending}",
                   delay=self.failure_grace)
