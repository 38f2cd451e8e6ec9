"""The elastic driver: ``tfringrun --host-discovery-script S --min-np A
--max-np B ... command`` (TCP only; docs/elastic.md has the user's view).

It serves the job's rendezvous store, runs the discovery script every
second (``host:slots`` lines), starts one worker per slot it may use (local
ones as subprocesses, others over ssh, each under the rank wrapper, which
ends the worker when the driver goes away) and decides each *round*: which
workers form the job and with which rank. The oldest surviving worker is
rank 0, so the state it broadcasts after a reset is one that was trained.
Rounds are published in the store (:mod:`tfring._store.elastic_protocol`);
workers take them at ``init()``, which ``elastic.run`` calls again after a
lost peer or at a commit that sees a newer round.

Policy:

* ``-np`` workers start; once the discovery script reports new slots, the
  job grows up to ``--max-np``.
* A worker that dies (killed, crashed) before it finished and without
  reporting an exception is lost: a new round is published without it.
  So is a worker that a peer reports gone (its host went silent: cut off the network, powered off):
  the driver stops it and leaves it out of the next round at once, without
  waiting to see its process end. Its slot stays empty until
  the discovery script's line for that host changes (a host that is
  replaced usually reappears with a new count, or after being dropped), so
  a dying machine is not refilled at once. A host with
  ``BLACKLIST_FAILURES`` lost workers gets no new ones (for a random time
  in ``--blacklist-cooldown-range`` when given, else for good).
* A host that leaves the discovery output, or lists fewer slots, loses its
  newest workers: they are left out of the next round and leave at their
  next commit, without a rollback for the others.
* A worker that reports an ordinary exception ends the job, named.
* Each round after the first is a reset; more than ``--reset-limit`` ends
  the job.
* Below ``--min-np`` the driver waits for slots, up to
  ``--elastic-timeout``, then fails naming what it waited for. A worker
  that has not reached ``init()`` after ``--start-timeout`` plus
  ``--elastic-timeout`` is stopped (and counts as lost).
* A worker that has *finished* (returned from ``elastic.run``, or ended
  its script: it says so in the store) and then exits non-zero fails the
  job, whichever worker ends first, as a rank of a fixed-size job does: the
  driver names it, its host and how it ended, gives the others
  ``FAILURE_GRACE_SECONDS`` to end by themselves, stops them and exits with
  that first failure's code (a signal: 128 + its number). A worker that
  ends without having finished (killed, crashed mid-training) is lost, as
  above, unless the job has finished.
* The job succeeds when a worker finishes with code 0 and every other
  member of the last round does too (they get ``--elastic-timeout``). A
  member that then exits non-zero fails the job as above; a worker lost in
  an earlier round, or one the driver told to leave or stopped, does not
  count.

Every way out stops and reaps every worker it started.
"""
import os
import random
import signal
import subprocess
import sys
import time

from tfring._store import elastic_protocol as protocol
from tfring._store import rendezvous, wire
from tfring.runner import hosts as hosts_mod
from tfring.runner import processes, rank_wrapper, remote, wrapper_link
from tfring.runner.console import say
from tfring.runner.elastic.rounds import Rounds
from tfring.runner.processes import describe_exit
from tfring.runner.supervisor import FAILURE_GRACE_SECONDS
from tfring.runner.wrapper_link import WrapperListener

BLACKLIST_FAILURES = 3
DISCOVERY_INTERVAL = 1.0
DISCOVERY_TIMEOUT = 30.0
_POLL = 0.05
_GRACE = 3.0
_LOCAL = "\0local"  # the key of every name of this machine
# A worker waits for a round this much longer than the driver waits for
# workers, so that the driver, which knows why, is the one that gives up.
_WORKER_MARGIN = 30.0


class DriverError(Exception):
    """A problem with the driver's inputs (discovery script, flags)."""


def parse_discovery(text, slots_per_host=None):
    """{host: slots} from the discovery script's output, in its order.

    Lines are ``host:slots`` or ``host`` (then ``slots_per_host``); blank
    lines and ``#`` comments are skipped.

    Raises:
        DriverError: a line is malformed, or names a host twice.

    Example:
        >>> parse_discovery("a:2\\nb:1\\n")
        {'a': 2, 'b': 1}
    """
    hosts = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, count = line.rpartition(":")
        if not sep:
            name, count = line, None
        name = name.strip()
        if count is None:
            if slots_per_host is None:
                raise DriverError(f"discovery line {number} ({raw!r}) gives no slot count; "
                                  "print host:slots or pass --slots-per-host")
            slots = slots_per_host
        else:
            count = count.strip()
            if not count.isdigit():
                raise DriverError(f"discovery line {number} ({raw!r}): slots must be a "
                                  "non-negative integer")
            slots = int(count)
        if not name or any(c.isspace() for c in name):
            raise DriverError(f"discovery line {number} ({raw!r}) names no host")
        if name in hosts:
            raise DriverError(f"discovery line {number}: host {name!r} is listed twice")
        hosts[name] = slots
    return hosts


class _Worker:
    def __init__(self, wid, host, local):
        self.wid, self.host, self.local = wid, host, local
        self.key = _LOCAL if local else host
        self.proc = None
        self.conn = None
        self.pid = None
        self.code = None          # exit code once ended (<0: signal)
        self.leaving = False      # removed by the discovery script
        self.announced = False    # it reached init() and asked to join
        self.stopping = False     # the driver stopped it for not starting
        self.cut_off = None       # when its peers found it gone and the driver stopped it
        self.rank = None
        self.spawned_at = time.monotonic()
        self.proc_ended_at = None

    def alive(self):
        return self.code is None

    def name(self):
        rank = f", rank {self.rank}" if self.rank is not None else ""
        return f"worker {self.wid} (on {self.host}{rank})"


class Driver:
    """Runs one elastic job; :meth:`run` returns tfringrun's exit code.

    Args:
        command: the worker command (a list).
        np: workers to start with. min_np, max_np: the bounds of the job's size.
        discovery_script: a shell command printing ``host:slots`` lines.
        slots_per_host: slots of a host listed without a count.
        elastic_timeout: seconds to wait below min_np (and for the last
            workers to finish after the first did).
        reset_limit: resets allowed (None: no limit).
        cooldown_range: (low, high) seconds a blacklisted host waits, or None.
        env: the workers' environment, without the job's secret and store.
        bind_host, advertise_host: where the store and the status listener
            listen, and the address workers reach them at.
        timeout: stop the whole job after this many seconds (exit 124).
        prefix_output, output_dir, verbose: as for tfringrun.
        ssh_port, ssh_identity_file: for workers on other hosts.
        interfaces: --network-interfaces, resolved on each remote host.
        discovery_interval: seconds between runs of the discovery script.
    """

    def __init__(self, command, *, np, min_np, max_np, discovery_script, slots_per_host=None,
                 elastic_timeout=600.0, reset_limit=None, cooldown_range=None, env=None,
                 bind_host="127.0.0.1", advertise_host="127.0.0.1", timeout=None,
                 start_timeout=30.0, prefix_output=True, output_dir=None, verbose=False,
                 ssh_port=None, ssh_identity_file=None, interfaces=(),
                 discovery_interval=DISCOVERY_INTERVAL):
        if not 1 <= min_np <= np <= max_np:
            raise DriverError(f"need 1 <= --min-np ({min_np}) <= -np ({np}) <= --max-np "
                              f"({max_np})")
        self.command = list(command)
        self.np, self.min_np, self.max_np = np, min_np, max_np
        self.target = np
        self.script = discovery_script
        self.slots_per_host = slots_per_host
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.cooldown_range = cooldown_range
        self.env = dict(os.environ if env is None else env)
        self.bind_host, self.advertise_host = bind_host, advertise_host
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.prefix_output, self.output_dir, self.verbose = prefix_output, output_dir, verbose
        self.ssh_port, self.ssh_identity_file = ssh_port, ssh_identity_file
        self.interfaces = list(interfaces)
        self.discovery_interval = discovery_interval

        self.workers = {}            # wid -> _Worker
        self.next_wid = 0
        self.hosts = None            # the last discovery output {name: slots}
        self.held = {}               # key -> slots held empty after lost workers
        self.failures = {}           # key -> lost workers
        self.blacklist = {}          # key -> until (monotonic; inf: for good)
        self.rounds = None           # the round bookkeeping, once the store is up
        self.succeeded_at = None
        self.outcome = None          # (code, message)
        self.stop_after = None       # the others' grace after a failure ends then
        self.signals = []
        self.events = []             # (monotonic, text): for benchmarks and --verbose
        self.secret = wire.generate_secret()
        self.store = None
        self.client = None
        self.wrappers = None         # the rank wrappers' listener, once running
        self.next_discovery = 0.0

    # -- output ----------------------------------------------------------------
    def _say(self, message):
        say(message)

    def _event(self, text, always=False):
        """Records what happened; says it with --verbose, or when `always`
        (the changes a user must see: lost and leaving workers, new rounds)."""
        self.events.append((time.monotonic(), text))
        if self.verbose or always:
            self._say(text)

    def _fail(self, code, message, grace=0.0):
        """Records the job's failure (the first one wins) and says it; the
        workers still running get `grace` seconds to end by themselves."""
        if self.outcome is None:
            self.outcome = (code, message)
            self._say(message)
            if grace > 0:
                self.stop_after = time.monotonic() + grace

    # -- discovery -------------------------------------------------------------
    def _discover(self):
        """Runs the script; returns {host: slots} or raises DriverError."""
        try:
            proc = subprocess.run(self.script, shell=True, capture_output=True, text=True,
                                  timeout=DISCOVERY_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise DriverError(f"the host discovery script {self.script!r} ran longer than "
                              f"{DISCOVERY_TIMEOUT:g} s") from None
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise DriverError(f"the host discovery script {self.script!r} exited with code "
                              f"{proc.returncode}: {detail[0]}")
        return parse_discovery(proc.stdout, self.slots_per_host)

    def _key(self, name):
        return _LOCAL if hosts_mod.is_local(name) else name

    def _apply_discovery(self, hosts):
        now = time.monotonic()
        by_key = {}
        for name, slots in hosts.items():
            key = self._key(name)
            by_key.setdefault(key, [name, 0])
            by_key[key][1] += slots
        old = {} if self.hosts is None else {k: v[1] for k, v in self.hosts.items()}
        grew = False
        for key, (name, slots) in by_key.items():
            if old.get(key) != slots:
                if key in old or self.hosts is not None:
                    self._event(f"discovery: {name} has {slots} slots")
                self.held.pop(key, None)  # a changed line frees the held slots
                grew = grew or slots > old.get(key, 0)
        for key in old:
            if key not in by_key:
                self._event(f"discovery: {self._host_name(key)} is gone")
                self.held.pop(key, None)
        if grew and self.hosts is not None:
            self.target = self.max_np
        self.hosts = by_key
        for key, until in list(self.blacklist.items()):
            if now >= until:
                del self.blacklist[key]
                self.failures.pop(key, None)
                self._say(f"{self._host_name(key)} may run workers again (cooldown over)")
        self._fit_workers_to_hosts()

    def _host_name(self, key):
        if self.hosts and key in self.hosts:
            return self.hosts[key][0]
        return "this host" if key == _LOCAL else key

    def _capacity(self, key):
        if key in self.blacklist or key not in self.hosts:
            return 0
        return max(0, self.hosts[key][1] - self.held.get(key, 0))

    def _fit_workers_to_hosts(self):
        """Marks surplus workers as leaving and starts new ones."""
        live = [w for w in self.workers.values() if w.alive() and not w.leaving]
        for key in {w.key for w in live}:
            mine = sorted((w for w in live if w.key == key), key=lambda w: w.wid)
            listed = self.hosts.get(key, [None, 0])[1]
            for w in mine[listed:] if len(mine) > listed else []:
                w.leaving = True
                self.rounds.dirty = True
                self._event(f"{w.name()} leaves: its host lists fewer slots", always=True)
        if self.succeeded_at is not None or self.outcome is not None:
            return
        live = [w for w in self.workers.values() if w.alive() and not w.leaving]
        want = min(self.target, sum(self._capacity(k) for k in self.hosts)) - len(live)
        for key in self.hosts:
            free = self._capacity(key) - sum(1 for w in live if w.key == key)
            while want > 0 and free > 0:
                self._spawn(key)
                want -= 1
                free -= 1

    # -- workers ---------------------------------------------------------------
    def _wrapper_command(self, env_stdin):
        cmd = [sys.executable, os.path.abspath(rank_wrapper.__file__),
               "--launcher", f"{self.advertise_host}:{self.wrappers.port}",
               "--grace", str(_GRACE), "--connect-timeout", str(self.start_timeout)]
        if self.prefix_output:
            cmd.append("--prefix")
        if self.output_dir:
            cmd += ["--output-dir", self.output_dir]
        if env_stdin:
            cmd.append("--env-stdin")
        return cmd + ["--"] + self.command

    def _spawn(self, key):
        wid = self.next_wid
        self.next_wid += 1
        name = self.hosts[key][0]
        worker = _Worker(wid, name, key == _LOCAL)
        self.workers[wid] = worker
        env = dict(self.env)
        env.update({
            "TFRING_CONTROLLER": "tcp", protocol.ELASTIC_ENV: "1",
            protocol.WORKER_ENV: str(wid),
            protocol.TIMEOUT_ENV: f"{self.elastic_timeout + _WORKER_MARGIN:g}",
            rank_wrapper.RANK_ENV: str(wid), rank_wrapper.TOKEN_ENV: self.wrappers.token,
            "TFRING_RENDEZVOUS_ADDR": self.advertise_host,
            "TFRING_RENDEZVOUS_PORT": str(self.store.address[1]),
            wire.SECRET_ENV: wire.encode_secret(self.secret),
            rank_wrapper.BIND_ENV: self.bind_host if worker.local else ""})
        if not worker.local and self.interfaces:
            # Resolved by the wrapper on that host: addresses differ per host.
            env[rank_wrapper.INTERFACES_ENV] = ",".join(self.interfaces)
        if not worker.local:
            # The worker registers under the name the driver numbered its
            # slots by, so two names of one machine cannot share a slot.
            env["TFRING_HOSTNAME"] = name
        elif "," in env.get("TFRING_HOSTNAME", ""):
            env.pop("TFRING_HOSTNAME")  # per-rank fake names mean nothing here
        for name_ in ("TFRING_SIZE", "TFRING_LOCAL_SLOT", "TFRING_HOST_ORDER",
                      "TFRING_RENDEZVOUS_SCOPE", "TFRING_RENDEZVOUS_SERVE"):
            env.pop(name_, None)
        try:
            if worker.local:
                worker.proc = subprocess.Popen(self._wrapper_command(False), env=env,
                                               start_new_session=True, stdin=subprocess.DEVNULL)
            else:
                argv = remote.ssh_command(name, self._wrapper_command(True), self.ssh_port,
                                          self.ssh_identity_file)
                worker.proc = subprocess.Popen(argv, start_new_session=True,
                                               stdin=subprocess.PIPE)
                remote.send_environment(worker.proc, env)
        except OSError as e:
            worker.code = 127 if isinstance(e, FileNotFoundError) else 126
            self._fail(1, f"cannot start a worker on {name}: {e.strerror or e}")
            return
        self._event(f"started worker {wid} on {name}")

    def _on_wrapper(self, kind, link, *details):
        worker = self.workers[link.id]
        if kind == wrapper_link.HELLO:
            worker.conn, worker.pid = link, details[0]
            if self.outcome is not None:
                link.stop()
        elif kind == wrapper_link.EXIT:
            link.release()
            self._ended(worker, details[0])
        # A wrapper lost without an exit is noticed through its process.

    def _ended(self, worker, code):
        if worker.code is not None:
            return
        worker.code = code
        was_member = worker.wid in self.rounds.members
        if code == 0:
            if worker.leaving:
                self._event(f"{worker.name()} left", always=True)
            elif self.outcome is None:
                self._event(f"{worker.name()} finished")
                if self.succeeded_at is None:
                    self.succeeded_at = time.monotonic()
            self.rounds.dirty = self.rounds.dirty or was_member
            return
        error = self.rounds.reported_error(worker.wid)
        if error is not None:
            self._fail(1, f"{worker.name()} raised {error}; stopping the job.")
            return
        if self.outcome is not None:
            return
        words, shell_code = describe_exit(code)
        excused = worker.leaving or worker.stopping or worker.cut_off is not None
        finished = not excused and self.rounds.reported_finished(worker.wid)
        if finished or (self.succeeded_at is not None and was_member and not excused):
            # Its training was over (or the job's was): nothing to recover,
            # so the job failed, whichever worker ended first, as a rank of
            # a fixed-size job that exits non-zero fails it.
            after = "it finished training" if finished else "the job finished"
            self._fail(shell_code, f"{worker.name()} {words} after {after}; the job failed; "
                                   "stopping it.", grace=FAILURE_GRACE_SECONDS)
            return
        if self.succeeded_at is not None:
            self._say(f"{worker.name()} {words} after the job finished")
            return
        self._event(f"{worker.name()} {words}; lost", always=True)
        self.rounds.dirty = True
        key = worker.key
        if not worker.leaving:
            self.held[key] = self.held.get(key, 0) + 1
        self.failures[key] = self.failures.get(key, 0) + 1
        if self.failures[key] >= BLACKLIST_FAILURES and key not in self.blacklist:
            if self.cooldown_range:
                wait = random.uniform(*self.cooldown_range)
                self.blacklist[key] = time.monotonic() + wait
                how = f"for {wait:.0f} s"
            else:
                self.blacklist[key] = float("inf")
                how = "for the rest of the job"
            self._say(f"{self._host_name(key)} lost {self.failures[key]} workers; it gets no "
                      f"new workers {how}")

    def _check_starting(self):
        """Stops workers that never reached init(): they count as lost."""
        limit = self.start_timeout + self.elastic_timeout
        now = time.monotonic()
        for w in self.workers.values():
            if (w.alive() and not w.announced and not w.stopping and w.proc is not None
                    and now - w.spawned_at > limit):
                w.stopping = True
                self._say(f"{w.name()} did not reach init() within {limit:g} s "
                          "(--start-timeout + --elastic-timeout); stopping it")
                if w.conn is not None:
                    w.conn.stop()
                processes.signal_group_and_leader(w.proc.pid, signal.SIGTERM)

    def _check_processes(self):
        now = time.monotonic()
        for worker in self.workers.values():
            if (worker.cut_off is not None and worker.code is None and worker.proc is not None
                    and worker.proc.poll() is None and now - worker.cut_off > _GRACE + 2.0):
                # Its wrapper cannot hear the stop, nor be released to exit.
                processes.signal_group_and_leader(worker.proc.pid, signal.SIGKILL)
            if worker.code is not None or worker.proc is None:
                continue
            code = worker.proc.poll()
            if code is None:
                continue
            # The wrapper's own report (with the real signal) may trail its exit.
            if worker.proc_ended_at is None:
                worker.proc_ended_at = now
            elif now - worker.proc_ended_at > 1.0:
                self._ended(worker, code if code < 128 else -(code - 128))

    # -- store -----------------------------------------------------------------
    def _poll_store(self):
        error, announced = self.rounds.poll()
        if error is not None:
            wid, text = error
            worker = self.workers.get(wid)
            self._fail(1, f"{worker.name() if worker else f'worker {wid}'} raised "
                          f"{text}; stopping the job.")
            return
        for wid in announced:
            worker = self.workers.get(wid)
            if worker is not None and not worker.announced:
                worker.announced = True
                self.rounds.dirty = True
        for wid, reporter in self.rounds.reported_lost().items():
            self._cut_off(self.workers.get(wid), self.workers.get(reporter))

    def _cut_off(self, worker, reporter):
        """Stops a worker that a peer found gone, and leaves it out of the
        next round, though its process may still look alive from here (its
        host was cut off the network: its wrapper cannot say anything). Every
        member's report counts, even one from a worker reported in turn: a
        survivor may name the peer that passed the failure on before the
        root cause reaches it, and waiting for a silent worker would hang
        the next round (at worst a healthy worker is restarted)."""
        if (worker is None or reporter is None or not worker.alive()
                or worker.cut_off is not None):
            return
        worker.cut_off = time.monotonic()
        self.rounds.dirty = True
        self._event(f"{worker.name()} is gone for its peers ({reporter.name()} says so); "
                    "stopping it", always=True)
        if worker.conn is not None:
            worker.conn.stop()
        if worker.proc is not None:
            processes.signal_group_and_leader(worker.proc.pid, signal.SIGTERM)

    def _publish_if_needed(self):
        if self.outcome is not None or self.succeeded_at is not None:
            return
        live = self._members()
        ready = sorted((w for w in live if w.announced), key=lambda w: w.wid)
        starting = sum(1 for w in live if not w.announced)
        # _check_starting bounds how long the starting workers take.
        leaving = [w.wid for w in self.workers.values()
                   if (w.leaving or w.cut_off is not None) and w.alive()]
        failure = self.rounds.decide(ready, starting, self._shortfall, leaving)
        if failure is not None:
            self._fail(1, failure)

    def _members(self):
        """Workers that can be in the next round. A worker its peers reported
        lost is not one, though its process may not have exited yet: the
        shortfall message counts the same workers the round decision does."""
        return [w for w in self.workers.values() if w.alive() and not w.leaving
                and w.cut_off is None]

    def _shortfall(self, what):
        live = self._members()
        hosts = ", ".join(f"{self._host_name(k)}: {self.hosts[k][1]} slots"
                          + (f" ({self.held[k]} held after lost workers)" if self.held.get(k)
                             else "") + (" blacklisted" if k in self.blacklist else "")
                          for k in self.hosts) or "none"
        return (f"{what} {self.min_np - len(live)} more worker slot(s): --min-np is "
                f"{self.min_np} and {len(live)} worker(s) are running; the discovery script "
                f"lists {hosts}.")

    # -- stopping --------------------------------------------------------------
    def _stop_all(self):
        """Stops every worker still running (stop, SIGTERM, then SIGKILL) and
        reaps every process started."""
        live = [w for w in self.workers.values() if w.proc is not None and w.proc.poll() is None]
        for w in live:
            if w.conn is not None:
                w.conn.stop()
            processes.signal_group_and_leader(w.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + _GRACE + 2.0
        while time.monotonic() < deadline and any(w.proc.poll() is None for w in live):
            self._pump(_POLL)
        for w in live:
            if w.proc.poll() is None:
                processes.signal_group_and_leader(w.proc.pid, signal.SIGKILL)
        for w in self.workers.values():
            if w.proc is not None:
                w.proc.wait()

    def _pump(self, timeout):
        for event in self.wrappers.poll(timeout):
            self._on_wrapper(*event)

    def _on_signal(self, signum, _frame):
        self.signals.append(signum)

    # -- main loop -------------------------------------------------------------
    def run(self):
        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.signal(s, self._on_signal) for s in handled}
        try:
            self.store = rendezvous.start_server(self.bind_host, 0, self.secret)
            self.client = rendezvous.RendezvousClient(self.bind_host if self.bind_host !=
                                                      "0.0.0.0" else "127.0.0.1",
                                                      self.store.address[1], self.secret)
            self.rounds = Rounds(self.client, min_np=self.min_np,
                                 elastic_timeout=self.elastic_timeout,
                                 reset_limit=self.reset_limit, say=self._say,
                                 event=lambda text, always: self._event(text, always))
            self.wrappers = WrapperListener(self.bind_host, known=lambda wid: wid in self.workers)
            try:
                self._apply_discovery(self._discover())
            except DriverError as e:
                self._fail(2, str(e))
                return self.outcome[0]
            return self._loop()
        finally:
            try:
                if self.wrappers is not None:
                    self._stop_all()
            finally:
                if self.wrappers is not None:
                    self.wrappers.close()
                if self.client is not None:
                    self.client.close()
                if self.store is not None:
                    self.store.stop()
                for s, handler in previous.items():
                    signal.signal(s, handler)

    def _loop(self):
        started = time.monotonic()
        while self.outcome is None:
            self._pump(_POLL)
            self._check_processes()
            now = time.monotonic()
            while self.signals:
                signum = self.signals.pop(0)
                self._fail(128 + signum, f"got {signal.Signals(signum).name}; stopping the job.")
            if self.timeout is not None and now - started > self.timeout:
                self._fail(124, f"the job ran past --timeout {self.timeout:g} s; stopping it.")
            if self.outcome is not None:
                break
            alive = [w for w in self.workers.values() if w.alive()]
            if self.succeeded_at is not None:
                if not alive:
                    return 0
                if now - self.succeeded_at > self.elastic_timeout:
                    self._fail(1, f"workers {', '.join(str(w.wid) for w in alive)} did not "
                                  f"finish within --elastic-timeout {self.elastic_timeout:g} s "
                                  "after the first one did; stopping them.")
                    break
                continue
            if now >= self.next_discovery:
                self.next_discovery = now + self.discovery_interval
                try:
                    self._apply_discovery(self._discover())
                except DriverError as e:
                    self._say(f"{e}; keeping the last host list")
            self._poll_store()
            self._check_starting()
            self._publish_if_needed()
        self._grace()
        return self.outcome[0]

    def _grace(self):
        """After a failure that allows it, lets the workers still running
        end by themselves until `stop_after` (a signal to tfringrun cuts it
        short); :meth:`run` then stops the rest."""
        while (self.stop_after is not None and not self.signals
               and time.monotonic() < self.stop_after
               and any(w.alive() and w.proc is not None for w in self.workers.values())):
            self._pump(_POLL)
            self._check_processes()
