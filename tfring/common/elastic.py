"""Elastic training, the worker's side shared by every framework module:
joining the driver's rounds, the :class:`State` protocol, and the retry
loop behind ``elastic.run`` (see docs/elastic.md).

A worker started by ``tfringrun --min-np/--max-np/--host-discovery-script``
has ``TFRING_ELASTIC=1`` and a worker id. Its ``init()`` first waits for the
newest round of the driver that includes it (:func:`join_round`), takes the
rank, size and place that round gives it, and then starts the TCP
controller in that round's own store scope.

It also tells the driver when it has *finished* (returned from
``elastic.run``, or its script ended): a worker that exits non-zero after
that failed the job, whichever worker ends first; one that ends without it
(killed, crashed mid-training) is lost and the job re-forms.
"""
import atexit
import copy
import functools
import os
import sys
import threading
import time

from tfring._store import elastic_protocol as protocol
from tfring._store import wire
from tfring._store.rendezvous import RendezvousClient
from tfring.common.exceptions import (Cause, HorovodInternalError, HostsUpdatedInterrupt,
                                      WorkerRemovedInterrupt, failure_of)

_TRUE = ("1", "true", "yes", "on")
# How long a worker waits for a round that includes it, unless the driver
# says otherwise (it passes its --elastic-timeout).
DEFAULT_TIMEOUT = 600.0
_POLL = 0.1
_EXIT_LOCK_TIMEOUT = 5.0


def enabled(env=None):
    """True in a worker that an elastic driver started."""
    env = os.environ if env is None else env
    return env.get(protocol.ELASTIC_ENV, "").strip().lower() in _TRUE


class _Membership:
    """This worker's view of the driver's rounds (one per process)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.client = None
        self.round = 0          # the round this worker last started
        self.info = None        # that round's record
        self.started = time.monotonic()
        self.finished = False   # the driver was told this worker finished

    @property
    def worker_id(self):
        wid = os.environ.get(protocol.WORKER_ENV, "").strip()
        if not wid:
            raise ValueError(f"{protocol.ELASTIC_ENV}=1 but {protocol.WORKER_ENV} is not set: "
                             "elastic workers are started by tfringrun --host-discovery-script.")
        return wid

    def _store(self):
        if self.client is None:
            addr = os.environ.get("TFRING_RENDEZVOUS_ADDR", "")
            port = os.environ.get("TFRING_RENDEZVOUS_PORT", "")
            if not addr or not port.isdigit():
                raise ValueError("an elastic worker needs TFRING_RENDEZVOUS_ADDR and "
                                 "TFRING_RENDEZVOUS_PORT (tfringrun sets them)")
            self.client = RendezvousClient(addr, int(port))
        return self.client

    def _call(self, method, *args, **kwargs):
        """One store request; a broken connection is made again once."""
        for attempt in (0, 1):
            try:
                return getattr(self._store(), method)(*args, **kwargs)
            except (wire.PeerClosedError, OSError) as e:
                if isinstance(e, wire.WireTimeoutError):
                    raise
                if self.client is not None:
                    self.client.close()
                self.client = None
                if attempt:
                    raise

    def latest_round(self):
        with self.lock:
            return int(self._call("add", protocol.SCOPE, protocol.LATEST, 0))

    def join(self, timeout=None):
        """Waits for the newest round that includes this worker and every
        member of which is ready, then exports its rank, size, place and
        store scope for the TCP start-up. Returns the round's record.

        Raises:
            WorkerRemovedInterrupt: the driver removed this worker.
            TimeoutError: no such round came within `timeout` seconds
                (default: the driver's --elastic-timeout).
        """
        if timeout is None:
            timeout = float(os.environ.get(protocol.TIMEOUT_ENV) or DEFAULT_TIMEOUT)
        wid = self.worker_id
        deadline = time.monotonic() + timeout
        _install_hooks()
        with self.lock:
            if self.round == 0:
                # Tells the driver this worker is up: a round that waits for
                # it now will not wait long.
                self._call("set", protocol.SCOPE, f"pending/{wid}", b"1")
            while True:
                latest = int(self._call("add", protocol.SCOPE, protocol.LATEST, 0))
                if latest > self.round:
                    info = protocol.decode_round(
                        self._call("get", protocol.SCOPE, protocol.round_key(latest), 10.0))
                    if wid in info.get("removed", ()):
                        raise WorkerRemovedInterrupt(
                            f"worker {wid} was removed by the elastic driver in round {latest}")
                    if wid in info["members"] and self._all_ready(latest, info, deadline):
                        self._export(latest, info)
                        return info
                    if wid in info["members"] and time.monotonic() <= deadline:
                        continue  # a newer round replaced it while waiting
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"tfring: elastic worker {wid} found no round that includes it within "
                        f"{timeout:g} s (newest round: {latest}, joined: {self.round})")
                time.sleep(_POLL)

    def _all_ready(self, r, info, deadline):
        scope = protocol.round_scope(r)
        try:
            self._call("set", scope, protocol.READY_PREFIX + self.worker_id, b"1")
            while True:
                try:
                    self._call("wait_prefix", scope, protocol.READY_PREFIX,
                               len(info["members"]), 0.25)
                    return True
                except wire.WireTimeoutError:
                    if int(self._call("add", protocol.SCOPE, protocol.LATEST, 0)) != r:
                        return False
                    if time.monotonic() > deadline:
                        return False
        except wire.ShuttingDownError:
            return False  # the driver deleted the round: a newer one replaced it

    def _export(self, r, info):
        me = info["members"][self.worker_id]
        os.environ.update({
            "TFRING_SIZE": str(info["size"]), "TFRING_RANK": str(me["rank"]),
            "TFRING_LOCAL_SLOT": str(me["local_slot"]),
            "TFRING_HOST_ORDER": str(me["host_order"]),
            "TFRING_RENDEZVOUS_SCOPE": protocol.round_scope(r)})
        self.round, self.info = r, info

    def request_reset(self, lost_rank=None):
        """Tells the driver this worker's communication in its round broke,
        and which rank of the round it found gone, when one is known: the
        driver may not see that worker go (its host is cut off)."""
        try:
            with self.lock:
                scope = protocol.round_scope(self.round)
                members = (self.info or {}).get("members", {})
                for wid, member in members.items():
                    if member.get("rank") == lost_rank and wid != self.worker_id:
                        self._call("set", scope, protocol.LOST_PREFIX + wid,
                                   self.worker_id.encode())
                self._call("add", scope, protocol.RESET, 1)
        except Exception:  # noqa: BLE001 - the driver also sees the lost peer itself
            pass

    def report_finished(self, finished=True):
        """Tells the driver this worker finished (returned from its elastic
        function, or its script is ending), or, with `finished` False, that
        it trains again (a second ``elastic.run``): a non-zero exit after it
        finished fails the job instead of counting as a lost worker."""
        if finished == self.finished:
            return
        # At interpreter exit a daemon thread may hold the lock for ever.
        if not self.lock.acquire(timeout=_EXIT_LOCK_TIMEOUT):
            return
        try:
            self._call("set", protocol.SCOPE, protocol.FINISHED_PREFIX + self.worker_id,
                       b"1" if finished else b"0")
            self.finished = finished
        except Exception:  # noqa: BLE001 - without the store there is no driver to tell
            pass
        finally:
            self.lock.release()

    def report_error(self, exc):
        """Leaves the exception that ends this worker for the driver to name."""
        text = f"{type(exc).__name__}: {exc}"[:2000]
        try:
            with self.lock:
                self._call("set", protocol.SCOPE, protocol.ERROR_PREFIX + self.worker_id,
                           text.encode())
        except Exception:  # noqa: BLE001 - the worker's non-zero exit still ends the job
            pass


_membership = _Membership()
_hook_installed = False


def _install_hooks():
    """Reports an uncaught exception to the driver, so that a script that
    dies outside ``elastic.run`` ends the job with its exception named
    instead of looking like a lost worker; and, at interpreter exit (the
    script ended, or called ``sys.exit``), that this worker finished, so
    that a non-zero exit code fails the job. A process killed by a signal,
    or one that calls ``os._exit``, runs no exit handler: it is lost."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    atexit.register(_membership.report_finished)
    previous = sys.excepthook

    def report(exc_type, exc, tb):
        if not issubclass(exc_type, (KeyboardInterrupt, WorkerRemovedInterrupt)):
            _membership.report_error(exc)
        previous(exc_type, exc, tb)
    sys.excepthook = report


def join_round():
    """Called by ``init()`` in an elastic worker before the TCP start-up."""
    return _membership.join()


def report_finished():
    """Tells the driver this worker finished: a non-zero exit after this
    fails the job rather than counting as a lost worker. ``elastic.run``
    calls it when its function returns, and an exit handler when the script
    ends; ``tfring.run`` when its function returns."""
    _membership.report_finished()


def round_replaced():
    """True when the driver has published a round newer than this worker's."""
    return _membership.latest_round() > _membership.round


def current_round():
    """The round this worker runs in (0 outside elastic mode)."""
    return _membership.round


class State:
    """What elastic training keeps in step across workers and rolls back on
    a failure. Subclasses implement :meth:`save`, :meth:`restore` and
    :meth:`sync`.

    Example:
        >>> state = hvd.elastic.ObjectState(epoch=0)
        >>> state.register_reset_callbacks([lambda: print("new size", hvd.size())])
    """

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions to call (without arguments) after each re-formation of the
        job, once the state was broadcast: e.g. to rescale the learning rate by
        the new size.

        Args:
            callbacks: a list of callables.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state as the point to roll back to, then checks for new
        hosts.

        Raises:
            HostsUpdatedInterrupt: the driver published a new membership.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt when the driver has published a round
        newer than this one. Every rank takes the same decision (the newest
        round any rank saw wins), so all of them leave at the same step.

        Raises:
            HostsUpdatedInterrupt: a newer round exists.
        """
        if not enabled():
            return
        newest = self._max_across_ranks(_membership.latest_round())
        if newest > _membership.round:
            raise HostsUpdatedInterrupt()

    def _max_across_ranks(self, value):
        raise NotImplementedError

    def save(self):
        """Keeps a copy of the current state (in memory)."""
        raise NotImplementedError

    def restore(self):
        """Puts the last saved copy back."""
        raise NotImplementedError

    def sync(self):
        """Makes every rank's state rank 0's, and saves it."""
        raise NotImplementedError


class ObjectState(State):
    """State made of plain Python values, kept as attributes; the frameworks'
    ``ObjectState`` classes give it their broadcast and rank.

    Args:
        bcast_object: callable(obj, root_rank) -> rank 0's obj on every rank.
        get_rank: callable() -> this process's rank.
        **kwargs: the values, e.g. ``epoch=0, batch=0``.
    """

    def __init__(self, bcast_object, get_rank, **kwargs):
        super().__init__()
        self._bcast_object = bcast_object
        self._get_rank = get_rank
        self._saved_state = kwargs
        self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def save(self):
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            current = {name: getattr(self, name) for name in self._saved_state}
            self._saved_state = self._bcast_object(current, 0)
            self._set_attrs()


def run_fn(func, reset, is_internal_error, stop_cause=None):
    """The retry loop behind the frameworks' ``elastic.run``.

    Args:
        func: the training function, called as func(state, *args, **kwargs).
        reset: re-forms the job (shutdown, then init, which joins the next
            round).
        is_internal_error: tells whether an exception is a lost peer (to be
            rolled back and retried), not an error of the script.
        stop_cause: optional; returns (Cause, rank or None) of why the core
            stopped, or None: the lost rank to report when the exception
            does not carry it (TensorFlow cancels a graph's other ops
            without it).

    Returns:
        The decorated function.
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not enabled():
            state.sync()
            return func(state, *args, **kwargs)
        needs_reset = False
        _membership.report_finished(False)  # a second elastic.run trains again
        try:
            while True:
                try:
                    if needs_reset:
                        reset()
                        needs_reset = False
                        state.sync()
                        state.on_reset()
                    else:
                        state.sync()
                    result = func(state, *args, **kwargs)
                    _membership.report_finished()
                    return result
                except HostsUpdatedInterrupt:
                    needs_reset = True
                except HorovodInternalError as e:
                    _roll_back(state, e, stop_cause)
                    needs_reset = True
                except Exception as e:  # noqa: BLE001 - sorted below
                    if not is_internal_error(e):
                        raise
                    _roll_back(state, e, stop_cause)
                    needs_reset = True
        except WorkerRemovedInterrupt as e:
            print(f"tfring: {e.message}; leaving the job", file=sys.stderr, flush=True)
            raise
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            if not isinstance(e, SystemExit) or e.code not in (0, None):
                _membership.report_error(e)
            raise
    return wrapper


def _roll_back(state, error, stop_cause=None):
    failure = failure_of(error)
    if (failure is None or failure[1] is None) and stop_cause is not None:
        failure = stop_cause()
    lost = failure[1] if failure is not None and failure[0] is Cause.PEER_FAILURE else None
    _membership.request_reset(lost)
    state.restore()

