"""What the elastic driver and its workers say to each other through the
rendezvous store (scope ``elastic``); docs/elastic.md describes the whole.

Keys:

* ``latest``: a counter, the newest round the driver published (0: none yet).
* ``round/<r>``: JSON of round r: ``{"round": r, "size": n, "members":
  {worker id: {"rank", "host", "host_order", "local_slot"}}, "removed":
  [worker ids]}``. Written before ``latest`` moves to r, so a worker that
  sees r can always read it.
* ``error/<worker id>``: the text of an ordinary exception that ends the job.
* ``finished/<worker id>``: ``1`` once the worker returned from its elastic
  function or its script ended (``0`` while it runs ``elastic.run`` again).
  A worker that exits non-zero after that failed the job; one that ends
  without it (killed, crashed) was lost while training.

Each round r has a scope of its own, :func:`round_scope`, where its TCP
start-up registers, and with:

* ``ready/<worker id>``: a member of round r is waiting to start it; the
  TCP start-up begins once every member is there, so a round that a newer
  one replaced is never half-started.
* ``reset``: a counter: members of round r whose communication broke and
  who ask for a new round.
* ``lost/<worker id>``: a member of round r that another member found gone
  (silent past the heartbeat timeout, or its connection broke); the value is
  the reporter's worker id. The driver stops such a worker and leaves it out
  of the next round even while its process seems alive to the driver (a
  host cut off the network).

The driver deletes round r's scope when it publishes round r + 1. A deleted
scope stays closed, so a member still starting round r (one of its peers
died on the way) fails at once and joins the newer round, instead of
waiting out its start-up timeout; the running members of round r no
longer use the store.
"""
import json

SCOPE = "elastic"
LATEST = "latest"
ERROR_PREFIX = "error/"
FINISHED_PREFIX = "finished/"
# Environment the driver gives each worker.
ELASTIC_ENV = "TFRING_ELASTIC"
WORKER_ENV = "TFRING_ELASTIC_WORKER"
TIMEOUT_ENV = "TFRING_ELASTIC_TIMEOUT"


def round_key(r):
    return f"round/{r}"


READY_PREFIX = "ready/"   # in round_scope(r)
RESET = "reset"           # in round_scope(r)
LOST_PREFIX = "lost/"     # in round_scope(r)


def round_scope(r):
    return f"elastic/round/{r}"


def encode_round(r, members, removed=()):
    """Round r as bytes. `members`: {worker id: {"rank", "host",
    "host_order", "local_slot"}}."""
    return json.dumps({"round": r, "size": len(members),
                       "members": {str(w): m for w, m in members.items()},
                       "removed": [str(w) for w in removed]}, sort_keys=True).encode()


def decode_round(data):
    info = json.loads(data.decode())
    if not isinstance(info, dict) or not isinstance(info.get("members"), dict):
        raise ValueError("malformed elastic round record")
    return info
