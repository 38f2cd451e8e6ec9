"""The elastic mode of :class:`~tfring.ray.RayExecutor`
(``RayExecutor(min_workers=, max_workers=)``).

Each worker is a Ray actor started without a placement group (Ray places
each one where it fits) and with ``TFRING_ELASTIC=1`` and a worker id, so
its ``init()`` joins the rounds this driver publishes in the job's store, as
under ``tfringrun --host-discovery-script`` (docs/elastic.md). The round
bookkeeping is tfringrun's own, :class:`~tfring.runner.elastic.rounds.Rounds`;
what differs is how workers come and go:

* An actor that dies (killed, node lost) is lost: the next round leaves it
  out, and the survivors, whose collectives fail, roll back and re-form
  inside ``hvd.elastic.run``.
* An actor that Ray still has but its peers found gone (its process frozen,
  its node cut off the network) is reported by them in the round's store
  scope, as under tfringrun: it is killed and left out the same way.
* While fewer than ``max_workers`` actors live and the cluster has the
  resources for one more, a new actor is started; it receives the running
  function and joins at the next round (the others take it in at their
  next ``state.commit()``).
* Below ``min_workers`` the job waits up to ``elastic_timeout`` for Ray to
  place replacements, then fails naming the shortfall.
* A worker whose function raises ends the job with that exception.
* The run succeeds when a worker's function returns; the others then get
  ``elastic_timeout`` to return too. Workers still waiting to join are
  stopped.
"""
import time

import ray

from tfring._store import wire
from tfring._store.rendezvous import RendezvousClient
from tfring.ray import worker
from tfring.runner import engine_env, start_rendezvous
from tfring.runner.elastic.rounds import Rounds

_POLL_SECONDS = 0.1
_SPAWN_INTERVAL = 1.0
# A worker waits for a round this much longer than the driver waits below
# min_workers, so that the driver, which knows why, is the one that gives up.
_WORKER_MARGIN = 30.0
# How long an exception a worker reported in the store may take to come
# back as its run's result (which carries the exception itself).
_ERROR_GRACE = 5.0


class _Member:
    """One worker: its actor and where it stands."""

    def __init__(self, wid, actor, describe_ref):
        self.wid, self.actor = wid, actor
        self.describe_ref = describe_ref
        self.described = None    # (host, address, pid, gpus)
        self.host = self.key = None
        self.setup_ref = None    # the setup call of a worker started during a run
        self.run_ref = None
        self.announced = False   # it reached init() and asked to join
        self.dead = False
        self.done = False        # its function returned
        self.result = None
        self.rank = None
        self.spawned_at = time.monotonic()

    def live(self):
        return not self.dead

    def name(self):
        rank = f", rank {self.rank}" if self.rank is not None else ""
        where = f" on {self.host}, pid {self.described[2]}" if self.described else ""
        return f"worker {self.wid}{where}{rank}"


class ElasticJob:
    """The workers and rounds of one elastic RayExecutor (see the module's
    docstring). Made by RayExecutor; not a public API."""

    def __init__(self, executor, *, num_workers, min_workers, max_workers, elastic_timeout,
                 reset_limit, verbose=False):
        self.ex = executor
        self.initial = num_workers
        self.min_workers, self.max_workers = min_workers, max_workers
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self.verbose = verbose
        self.members = {}        # wid -> _Member
        self.next_wid = 0
        self.store = self.client = self.rounds = None
        self.secret = None
        self.store_addr = None
        self.executable = (None, (), {})
        self.events = []         # (monotonic, text): what happened, for tests and benchmarks
        self._next_spawn = 0.0

    # -- output ------------------------------------------------------------
    def _say(self, message):
        self.events.append((time.monotonic(), message))
        print(f"tfring.ray: {message}", flush=True)

    def _event(self, text, always=False):
        self.events.append((time.monotonic(), text))
        if self.verbose or always:
            print(f"tfring.ray: {text}", flush=True)

    # -- start -------------------------------------------------------------
    def start(self, executable_cls, executable_args, executable_kwargs):
        self.executable = (executable_cls, executable_args, executable_kwargs)
        self.secret = wire.generate_secret()
        address = ray.util.get_node_ip_address()
        self.store, addr, port = start_rendezvous(address, 0, self.secret)
        self.store_addr = (addr, port)
        self.client = RendezvousClient(addr, port, self.secret)
        self.rounds = Rounds(self.client, min_np=self.min_workers,
                             elastic_timeout=self.elastic_timeout, reset_limit=self.reset_limit,
                             say=self._say, event=self._event,
                             timeout_name="elastic_timeout", reset_limit_name="reset_limit")
        for _ in range(self.initial):
            self._spawn()
        # Start-up waits for the first workers, as the fixed-size executor
        # does; those Ray cannot place in time are given up, and the job
        # starts if at least min_workers are up.
        deadline = time.monotonic() + self.ex.start_timeout
        while time.monotonic() < deadline and any(m.described is None
                                                  for m in self._live()):
            self._watch_starting(wait=_POLL_SECONDS)
        late = [m for m in self._live() if m.described is None]
        for m in late:
            self._kill(m)
            m.dead = True
        up = self._live()
        for m in up:
            m.setup_ref = self._setup(m)
        ray.get([m.setup_ref for m in up], timeout=self.ex.start_timeout)
        for m in up:
            m.setup_ref = None
        if len(up) < self.min_workers:
            raise TimeoutError(
                f"Ray started {len(up)} of the {self.initial} workers within "
                f"{self.ex.start_timeout:g} s, fewer than min_workers ({self.min_workers}); "
                f"{self._resources()}")

    def _resources(self):
        return (f"the cluster has {ray.cluster_resources()} in all, "
                f"{ray.available_resources()} free")

    def _live(self):
        return [m for m in self.members.values() if m.live()]

    def _spawn(self):
        wid = self.next_wid
        self.next_wid += 1
        actor = worker.start(wid, num_cpus=self.ex.cpus_per_worker, max_restarts=0)
        member = _Member(wid, actor, actor.describe.remote())
        self.members[wid] = member
        self._event(f"started worker {wid}")
        return member

    def _setup(self, m):
        env = engine_env.elastic_worker_environment(
            m.wid, m.host, self.store_addr[0], self.store_addr[1], self.secret,
            self.elastic_timeout + _WORKER_MARGIN, bind_host=m.described[1],
            extra=self.ex.env_vars)
        cls, args, kwargs = self.executable
        return m.actor.setup.remote(env, cls, args, kwargs,
                                    unset=engine_env.ELASTIC_ROUND_VARIABLES)

    def _watch_starting(self, wait):
        """Takes in the host reports of starting workers."""
        refs = {m.describe_ref: m for m in self._live() if m.described is None}
        if not refs:
            time.sleep(wait)
            return []
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait)
        described = []
        for ref in ready:
            m = refs[ref]
            try:
                m.described = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                self._lost(m, e)
                continue
            m.host = m.key = m.described[0]
            described.append(m)
        return described

    def _kill(self, m):
        try:
            ray.kill(m.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _cut_off(self, m, reporter):
        """Kills a member that a peer found gone although Ray still has its
        actor (a frozen process answers neither its peers nor Ray's calls),
        so that the next round can form without it. Every report counts, as
        under tfringrun (tfring.runner.elastic.driver): at worst a healthy
        worker is replaced; waiting on a silent one would hang the job."""
        if m is None or reporter is None or not m.live():
            return
        self._kill(m)
        self._lost(m, ConnectionError(f"gone for its peers ({reporter.name()} says so); "
                                      "its actor was killed"))

    def _lost(self, m, error):
        if m.dead:
            return
        m.dead = True
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        self._event(f"{m.name()} was lost ({type(error).__name__}"
                    f"{': ' + first[:200] if first else ''})", always=True)
        self.rounds.dirty = True

    # -- running -----------------------------------------------------------
    def run(self, fn, args, kwargs, with_executable, timeout):
        """Runs `fn` on every worker, through losses and replacements.
        Returns the final round's results by rank; raises as RayExecutor.run."""
        call = (fn, args, kwargs, with_executable)
        for m in self._live():
            m.done, m.result = False, None
            if m.described is not None and m.setup_ref is None:
                m.run_ref = m.actor.execute.remote(*call)
        started = time.monotonic()
        succeeded_at = None
        error_seen = None        # (when, wid, text) of an exception reported in the store
        while True:
            now = time.monotonic()
            if timeout is not None and now - started > timeout:
                self.ex._fail(f"the run passed its timeout of {timeout:g} s")
                raise TimeoutError(f"RayExecutor.run (elastic): the job had not finished "
                                   f"after {timeout:g} s; it was stopped")
            for m in self._watch_starting(wait=0):
                if succeeded_at is not None:
                    continue  # stopped below: the job it would join is over
                # Setup and the run go in one after the other: Ray runs an
                # actor's calls from one caller in order.
                self._setup(m)
                m.run_ref = m.actor.execute.remote(*call)
            refs = {m.run_ref: m for m in self._live() if m.run_ref is not None and not m.done}
            ready = []
            if refs:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=_POLL_SECONDS)
            else:
                time.sleep(_POLL_SECONDS)
            for ref in ready:
                m = refs[ref]
                try:
                    status, value = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self._lost(m, e)
                    continue
                if status != "ok":
                    rank = m.rank if m.rank is not None else -1
                    self.ex._fail(f"worker {m.wid} raised")
                    raise self.ex._raised(rank, *value[:3], where=m.name())
                m.done, m.result = True, value
                self._event(f"{m.name()} finished")
                if succeeded_at is None:
                    succeeded_at = time.monotonic()
            if succeeded_at is not None:
                self._stop_joining()
            members = self._live()
            if succeeded_at is not None:
                if all(m.done for m in members if m.wid in self.rounds.members):
                    return self._results()
                if time.monotonic() - succeeded_at > self.elastic_timeout:
                    late = [m.name() for m in members if not m.done]
                    self.ex._fail("workers did not finish")
                    raise TimeoutError(f"{', '.join(late)} did not finish within "
                                       f"elastic_timeout {self.elastic_timeout:g} s after "
                                       "the first worker did; the job was stopped")
                continue
            error, announced = self.rounds.poll()
            if error is not None and error_seen is None:
                error_seen = (time.monotonic(), *error)
            if error_seen is not None and time.monotonic() - error_seen[0] > _ERROR_GRACE:
                _, wid, text = error_seen
                self.ex._fail(f"worker {wid} raised")
                raise RuntimeError(f"tfring.ray: worker {wid} raised {text}; the job was "
                                   "stopped")
            for wid in announced:
                m = self.members.get(wid)
                if m is not None and m.live() and not m.announced:
                    m.announced = True
                    self.rounds.dirty = True
            for wid, reporter in self.rounds.reported_lost().items():
                self._cut_off(self.members.get(wid), self.members.get(reporter))
            self._check_starting()
            self._maybe_spawn()
            ready_members = sorted((m for m in members if m.announced and m.live()),
                                   key=lambda m: m.wid)
            # Only placed actors are on their way: one Ray cannot place
            # must not hold off the elastic timeout.
            starting = sum(1 for m in members
                           if m.live() and not m.announced and m.described is not None)
            failure = self.rounds.decide(ready_members, starting, self._shortfall)
            if failure is not None:
                self.ex._fail(failure)
                raise RuntimeError(f"tfring.ray: {failure}")

    def _results(self):
        by_rank = sorted((info["rank"], wid) for wid, info in self.rounds.members.items())
        return [self.members[wid].result for _, wid in by_rank]

    def _stop_joining(self):
        """The job is over: workers not in the last round will never be."""
        for m in self._live():
            if m.wid not in self.rounds.members:
                self._event(f"{m.name()} was still joining; stopping it")
                self._kill(m)
                m.dead = True

    def _check_starting(self):
        """Gives up on workers that did not reach init() in time (Ray could
        not place them, or they hang before init()): they count as lost."""
        limit = self.ex.start_timeout + self.elastic_timeout
        now = time.monotonic()
        for m in self._live():
            if not m.announced and m.wid not in self.rounds.members \
                    and now - m.spawned_at > limit:
                self._say(f"{m.name()} did not reach init() within {limit:g} s "
                          "(start_timeout + elastic_timeout); stopping it")
                self._kill(m)
                self._lost(m, TimeoutError("never reached init()"))

    def _maybe_spawn(self):
        """Starts a worker when fewer than max_workers live and Ray has room
        for one; one at a time, since a worker Ray cannot place yet holds
        no resources and would be counted again."""
        now = time.monotonic()
        if now < self._next_spawn:
            return
        self._next_spawn = now + _SPAWN_INTERVAL
        live = self._live()
        if len(live) >= self.max_workers or any(m.described is None for m in live):
            return
        free = ray.available_resources()
        if free.get("CPU", 0.0) + 1e-9 < self.ex.cpus_per_worker:
            return
        self._spawn()

    def _shortfall(self, what):
        running = [m for m in self._live() if m.described is not None]
        unplaced = len(self._live()) - len(running)
        return (f"{what} {self.min_workers - len(running)} more worker(s): min_workers is "
                f"{self.min_workers} and {len(running)} worker(s) are running"
                + (f" ({unplaced} more waiting for Ray to place it)" if unplaced else "")
                + f"; {self._resources()}.")

    def workers(self):
        """[{"rank", "worker", "host", "address", "pid"}] of the live
        workers that have reported where they run."""
        found = []
        for m in self._live():
            if m.described is not None:
                rank = self.rounds.members.get(m.wid, {}).get("rank") if self.rounds else None
                found.append({"rank": rank, "worker": m.wid, "host": m.host,
                              "address": m.described[1], "pid": m.described[2]})
        return sorted(found, key=lambda w: w["worker"])

    # -- stopping ----------------------------------------------------------
    def teardown(self, graceful, stop_seconds):
        members, self.members = list(self.members.values()), {}
        live = [m for m in members if m.live()]
        if graceful and live:
            try:
                ray.wait([m.actor.stop_tfring.remote() for m in live], num_returns=len(live),
                         timeout=stop_seconds)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        for m in members:
            self._kill(m)
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.store is not None:
            self.store.stop()
            self.store = None
