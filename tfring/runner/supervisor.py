"""Watches a running job: which ranks started, which ended and how, and stops it.

hydra alone is not enough to run a job well:

* it does not say which rank failed or with which code;
* when a rank that never called MPI_Init (or one that is stuck before it)
  exits non-zero, hydra keeps the other ranks running, possibly for ever;
* a killed mpiexec can leave ranks behind.

So every rank runs under :mod:`tfring.runner.rank_wrapper`, which connects
back to a TCP listener here, says ``hello`` when its command has started and
``exit RANK CODE`` when it ends. How the wrappers are started is the job's
*launch mode*, the one thing that differs between controllers:
:class:`~tfring.runner.processes.MpiexecLaunch` (one mpiexec process starts every rank, MPI) and
:class:`RankProcessesLaunch` (tfringrun starts one process per rank itself: a
local wrapper, or ssh running a remote one; TCP). The supervisor starts the
mode's processes in their own sessions (so a terminal's Ctrl-C reaches only
tfringrun, which then stops the job in order) and loops until none is left:

* the first rank that exits non-zero (or dies of a signal) is reported on
  stderr and the job is stopped;
* ``--timeout`` expiring, ranks that have not started within
  ``--start-timeout``, and SIGINT/SIGTERM/SIGHUP on tfringrun also stop it.

Stopping sends ``stop`` to every wrapper (each SIGTERMs its rank's process
group and SIGKILLs what is left after the grace period), SIGTERMs what
starts the ranks that have not connected yet (mpiexec, or those ranks' own
processes), and, if processes remain after the grace period plus a margin,
SIGKILLs every process the launch mode started and everything under them. A
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
import os
import signal
import socket
import time

from tfring.runner import rank_wrapper as wire
from tfring.runner import processes, shm_cleanup, wrapper_link
from tfring.runner.console import say
from tfring.runner.processes import describe_exit, format_ranks
from tfring.runner.wrapper_link import WrapperListener

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


class _Rank:
    def __init__(self):
        self.host = None
        self.pid = None
        self.code = None  # None while running


class Supervisor:
    """Runs one job in a launch mode and turns what the wrappers report into
    an exit code."""

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
        self.ranks = {r: _Rank() for r in range(num_proc)}
        self.wrappers = WrapperListener(bind_host, known=lambda rank: rank in self.ranks)
        self.token = self.wrappers.token
        self.address = f"{advertise_host}:{self.wrappers.port}"
        self.job = None            # the launch mode, once run() started it
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
        say(message)

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
        """Pids of the job's processes on this host: everything the launch
        mode started and everything under it, and every member of a running
        rank's process group (a process the rank's command started stays in
        it after its parent died)."""
        groups = {s.pid for s in self.ranks.values()
                  if s.pid is not None and s.code is None and s.host == self.hostname}
        table = processes.process_table()
        roots = self.job.roots()
        pids = set(roots) | set(processes.descendants(roots, table))
        pids.update(pid for pid, (_, pgrp) in table.items() if pgrp in groups)
        return pids

    def _note_shm(self):
        """Notes the MPI shared-memory files the job's processes here map now."""
        self.next_shm_scan = time.monotonic() + _SHM_SCAN_SECONDS
        if self.job is not None and self.job.started():
            self.shm_paths |= shm_cleanup.mapped_segments(self._local_processes())

    # -- wrapper messages --------------------------------------------------
    def _on_hello(self, link, pid, host):
        state = self.ranks[link.id]
        state.pid, state.host = pid, host
        if self.verbose:
            self._say(f"rank {link.id} started on {host} (pid {pid})")
        if self.stop_deadline is not None:
            link.stop()

    def _on_lost(self, link, exits):
        if self.ranks[link.id].code is not None:
            return
        # The wrapper died without reporting: treat as killed.
        self.ranks[link.id].code = -signal.SIGKILL
        exits.append((link.id, -signal.SIGKILL))
        if self.verbose or self.outcome is not None:
            self._say(f"{self._rank_name(link.id)} ended without reporting how "
                      "(its wrapper was killed); counted as killed by SIGKILL")

    def _poll_wrappers(self, timeout):
        """Handles wrapper traffic; returns [(rank, code)] of ranks that just ended."""
        exits = []
        for kind, link, *details in self.wrappers.poll(timeout):
            if kind == wrapper_link.HELLO:
                self._on_hello(link, *details)
            elif kind == wrapper_link.EXIT:
                self.ranks[link.id].code = details[0]
                exits.append((link.id, details[0]))
                self._report_end(link.id, details[0])
            else:
                self._on_lost(link, exits)
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
    def _release(self):
        """Lets waiting wrappers exit, once no rank is running any more."""
        if self._running():
            return
        for link in self.wrappers.authenticated():
            link.release()

    def _stop(self, code, message, delay=0.0):
        """Records why the job ends (first reason wins) and starts stopping it,
        after `delay` seconds if the ranks may still end by themselves."""
        if self.outcome is None:
            self.outcome = (code, message)
            self._say(message)
        if self.stop_deadline is not None:
            return
        if delay > 0 and self.job.running():
            if self.deferred_stop is None:
                self.deferred_stop = time.monotonic() + delay
            return
        self.deferred_stop = None
        self._note_shm()  # before any rank is told to go
        self.stop_deadline = time.monotonic() + self.grace + _KILL_MARGIN
        for link in self.wrappers.authenticated():
            link.stop()
        if self._not_started():
            self.job.stop_unstarted(self._not_started())

    def _kill_everything(self):
        """SIGKILLs every process the launch mode started and every process
        under them, and this host's ranks."""
        if self.killed:
            return
        self.killed = True
        if self._running() or self._not_started():
            self._say(f"ranks {format_ranks(self._running() + self._not_started())} did not "
                      f"stop within {self.grace + _KILL_MARGIN:g} s; killing them")
        self._note_shm()
        victims = processes.descendants(self.job.roots())
        for rank in self._running():
            state = self.ranks[rank]
            if state.host == self.hostname:
                try:
                    # The wrapper leads its own process group (hydra setsid()s
                    # each rank), which holds the command too.
                    os.killpg(state.pid, signal.SIGKILL)
                except OSError:
                    pass
        self.job.kill()
        for pid in victims:
            processes.signal_process(pid, signal.SIGKILL)

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
    def run(self, job, env=None):
        """Starts the job and supervises it; returns tfringrun's exit code.

        Args:
            job: the launch mode (:class:`MpiexecLaunch` or
                :class:`RankProcessesLaunch`); a list is an mpiexec command line.
            env: the job's environment (default: this process's); the job
                token is added to it.
        """
        self.job = processes.MpiexecLaunch(job) if isinstance(job, (list, tuple)) else job
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        env = dict(os.environ if env is None else env, **{wire.TOKEN_ENV: self.token})
        try:
            self.job.start(env)
            return self._supervise()
        finally:
            # Every way out, an exception included, ends the job and cleans
            # up after it; signals meanwhile are only noted.
            try:
                if self.job.running():
                    self._kill_everything()
                self.job.wait()
                if self.job.started():
                    self.shm_removed, self.shm_left = shm_cleanup.remove_leftovers(
                        self.shm_paths, wait=self.grace + _KILL_MARGIN)
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)
                self.wrappers.close()

    def _supervise(self):
        started_at = time.monotonic()
        unexplained = []  # (when, rank, code, what): launch processes that ended
        while self.job.running():
            self._on_exits(self._poll_wrappers(_POLL_SECONDS))
            unexplained = self._check_launch_ends(unexplained)
            self._check_deadlines(started_at)
            if self._running() and time.monotonic() >= self.next_shm_scan:
                self._note_shm()
        # A wrapper's last message can still be in flight when the last
        # launch process exits.
        drain_until = time.monotonic() + _DRAIN_SECONDS
        while self.wrappers.links and time.monotonic() < drain_until:
            self._on_exits(self._poll_wrappers(_POLL_SECONDS))
        self._check_launch_ends(unexplained, final=True)
        if self.outcome is not None or self.verbose:
            self._report_unended()
        if self.outcome is not None:
            return self.outcome[0]
        failure = self.job.failure(self._not_started())
        if failure is not None:
            self._say(failure[1])
            return failure[0]
        return 0

    def _check_launch_ends(self, pending, final=False):
        """Judges the launch processes that ended (one per rank in
        :class:`RankProcessesLaunch`): one whose rank never said hello
        failed to start it (ssh could not connect, the wrapper could not
        reach tfringrun), and that fails the job. A wrapper's own messages
        may trail its exit, so each waits `_DRAIN_SECONDS` (or the end of
        the job) before it is judged. Returns the ones still waiting."""
        now = time.monotonic()
        pending = pending + [(now, *e) for e in self.job.ended_without_rank()]
        waiting = []
        for when, rank, code, what in pending:
            if not final and now - when < _DRAIN_SECONDS:
                waiting.append((when, rank, code, what))
                continue
            state = self.ranks[rank]
            if state.pid is not None or state.code is not None:
                continue  # it started: its own report (or its silence) counts
            state.code = code if code != 0 else 1
            words, shell_code = describe_exit(code)
            self._stop(shell_code if code != 0 else 1,
                       f"{self._rank_name(rank)} did not start: {what} {words}; "
                       + ("stopping the job." if self.job.running() else "the job has ended."))
        return waiting

    def _report_unended(self):
        """Names the ranks whose end nobody reported, so that none is missing."""
        never = self._not_started()
        if never:
            self._say(f"ranks {format_ranks(never)} never started")
        silent = self._running()
        if silent:
            # A rank whose wrapper was never heard of again, on another host:
            # most often that host is gone (down, cut off the network).
            remote = sorted({self.ranks[r].host for r in silent
                             if self.ranks[r].host and self.ranks[r].host != self.hostname})
            where = (f" (on {', '.join(remote)}: no word from there; is it still reachable?)"
                     if remote else "")
            self._say(f"ranks {format_ranks(silent)} did not report how they ended{where}")

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
        ending = "stopping the job." if self.job.running() else "the job has ended."
        self._stop(shell_code, f"{self._rank_name(rank)} {what}; {ending}",
                   delay=self.failure_grace)
