"""The round bookkeeping of an elastic job, shared by every driver that
forms one (tfringrun's :class:`~tfring.runner.elastic.driver.Driver`, the
Ray executor's elastic mode): which workers are ready, when a new round is
due, who is rank 0, the reset limit and the wait below the minimum size.

A driver owns its workers' processes (subprocesses, Ray actors); this
class owns only what it publishes in the rendezvous store
(:mod:`tfring._store.elastic_protocol`) and what the workers leave there.
It is told about workers as objects with ``wid`` (an int, in start order),
``key`` (what identifies their host: workers with one key share a host)
and ``host`` (its name), and it sets their ``rank`` when it publishes.
"""
import time

from tfring._store import elastic_protocol as protocol
from tfring._store import wire

# A member's reset request waits this long for the driver to see which
# worker died, so that the next round leaves it out.
RESET_GRACE = 2.0


class Rounds:
    """Decides and publishes an elastic job's rounds.

    Args:
        client: a :class:`~tfring.runner.rendezvous.RendezvousClient` of the
            job's store.
        min_np: the fewest workers a round may have.
        elastic_timeout: seconds to wait below `min_np` before failing.
        reset_limit: resets allowed (None: no limit); every round after the
            first is one.
        say: called with a message a user must see (waiting below min_np).
        event: called with (text, always) for each round published.
        timeout_name, reset_limit_name: how the user set the two limits
            (a flag, a keyword), for the messages that name them.

    Example:
        >>> rounds = Rounds(client, min_np=2, elastic_timeout=60, reset_limit=None,
        ...                 say=print, event=lambda text, always: print(text))
        >>> rounds.poll(workers)          # errors, announced workers, reset requests
        >>> failure = rounds.decide(ready, starting=0, shortfall=lambda what: what)
    """

    def __init__(self, client, *, min_np, elastic_timeout, reset_limit, say, event,
                 timeout_name="--elastic-timeout", reset_limit_name="--reset-limit"):
        self.client = client
        self.min_np = min_np
        self.elastic_timeout = elastic_timeout
        self.reset_limit = reset_limit
        self._say, self._event = say, event
        self.timeout_name, self.reset_limit_name = timeout_name, reset_limit_name
        self.round = 0
        self.members = {}            # wid -> member record of the current round
        self.resets = 0
        self.dirty = True            # a new round may be needed
        self.waiting_since = None    # below min_np since
        self.reset_seen = None       # when a reset request of the current round was seen

    def reported_error(self, wid):
        """The exception text worker `wid` left in the store, or None."""
        try:
            return self.client.get(protocol.SCOPE, protocol.ERROR_PREFIX + str(wid),
                                   timeout=0).decode(errors="replace")
        except wire.WireError:
            return None

    def reported_finished(self, wid):
        """True when worker `wid` said it finished (returned from its
        elastic function, or its script ended) and has not started training
        again since."""
        try:
            return self.client.get(protocol.SCOPE, protocol.FINISHED_PREFIX + str(wid),
                                   timeout=0) == b"1"
        except wire.WireError:
            return False

    def poll(self):
        """Reads what the workers left in the store.

        Returns:
            (error, announced): `error` is (wid, text) of a worker that
            reported an exception ending the job, or None; `announced` the
            set of worker ids that reached ``init()`` so far.
        """
        errors = self.client.wait_prefix(protocol.SCOPE, protocol.ERROR_PREFIX, 0, timeout=0)
        for key, value in errors:
            return (int(key[len(protocol.ERROR_PREFIX):]), value.decode(errors="replace")), set()
        announced = {int(key[len("pending/"):]) for key, _ in
                     self.client.wait_prefix(protocol.SCOPE, "pending/", 0, timeout=0)}
        if self.round and self.reset_seen is None:
            if self.client.add(protocol.round_scope(self.round), protocol.RESET, 0) > 0:
                self.reset_seen = time.monotonic()
        if self.reset_seen is not None and time.monotonic() - self.reset_seen > RESET_GRACE:
            self.dirty = True
        return None, announced

    def reported_lost(self):
        """{worker id: reporter's worker id} of the members of the current
        round that another member found gone."""
        if not self.round:
            return {}
        try:
            entries = self.client.wait_prefix(protocol.round_scope(self.round),
                                              protocol.LOST_PREFIX, 0, timeout=0)
        except wire.ShuttingDownError:
            return {}
        return {int(key[len(protocol.LOST_PREFIX):]): int(value) for key, value in entries}

    def decide(self, ready, starting, shortfall, leaving=()):
        """Publishes a new round when one is due and may be.

        Args:
            ready: the live workers that reached ``init()`` and stay, in
                start order (the oldest first: it becomes rank 0).
            starting: how many live workers are still on their way to
                ``init()`` (the first round waits for them).
            shortfall: called with a phrase ("waiting for", "gave up ...
                waiting for"); returns the message that names what is missing.
            leaving: ids of live workers to tell to leave in the next round.

        Returns:
            None, or the message of a failure that ends the job (below
            min_np past the elastic timeout, or past the reset limit).
        """
        if not self.dirty:
            return None
        leaving = list(leaving)
        if (self.round and {w.wid for w in ready} == set(self.members)
                and self.reset_seen is None
                and not any(wid in self.members for wid in leaving)):
            self.dirty = bool(starting)
            self.waiting_since = None
            return None
        if len(ready) < self.min_np or (self.round == 0 and starting):
            if len(ready) + starting >= self.min_np:
                # Enough workers are on their way (the first round waits for
                # all of them); the driver bounds how long they take.
                self.waiting_since = None
                return None
            # Short of workers: the elastic timeout runs.
            now = time.monotonic()
            if self.waiting_since is None:
                self.waiting_since = now
                self._say(shortfall("waiting for"))
            elif now - self.waiting_since > self.elastic_timeout:
                return shortfall(f"gave up after {self.timeout_name} "
                                 f"{self.elastic_timeout:g} s waiting for")
            return None
        if self.round and self.reset_limit is not None and self.resets >= self.reset_limit:
            return (f"the job reached {self.reset_limit_name} {self.reset_limit} ({self.resets} "
                    "resets) and needs another one; stopping the job.")
        self.publish(ready, leaving)
        return None

    def publish(self, ready, leaving=()):
        """Publishes the next round of the workers `ready` (oldest first)."""
        previous = self.round
        self.round += 1
        if previous:
            self.resets += 1
        order, slots, members = {}, {}, {}
        for w in ready:  # oldest first: the oldest survivor is rank 0
            order.setdefault(w.key, len(order))
            slots[w.key] = slots.get(w.key, 0) + 1
            members[w.wid] = {"host": w.host, "host_order": order[w.key],
                              "local_slot": slots[w.key] - 1}
        by_place = sorted(members, key=lambda wid: (members[wid]["host_order"],
                                                    members[wid]["local_slot"]))
        for rank, wid in enumerate(by_place):
            members[wid]["rank"] = rank
        for w in ready:
            w.rank = members[w.wid]["rank"]
        removed = list(leaving)
        self.client.set(protocol.SCOPE, protocol.round_key(self.round),
                        protocol.encode_round(self.round, members, removed))
        self.client.add(protocol.SCOPE, protocol.LATEST, 1)
        if previous:
            # Its running members no longer need it; the ones still starting
            # it fail at once and join this round.
            self.client.delete_scope(protocol.round_scope(previous))
        self.members = members
        self.dirty = False
        self.waiting_since = None
        self.reset_seen = None
        placed = ", ".join(f"{wid}->rank {m['rank']}" for wid, m in members.items())
        self._event(f"round {self.round}: {len(members)} workers ({placed})"
                    + (f"; {len(removed)} leaving" if removed else ""), previous > 0)
