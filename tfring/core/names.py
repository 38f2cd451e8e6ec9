"""Default names of tfring.core's collectives: ``<kind>.noname.<n>``,
counted per process set. Ranks match their collectives by name, so a name
must come out the same on every member that makes the same calls in a set
in the same order; a rank outside a set makes none of its calls, so one
count for all sets would drift apart."""
import itertools
import threading

_lock = threading.Lock()
_counters = {}


def auto_name(kind, process_set_id):
    """The next default name of a ``kind`` collective in a set."""
    with _lock:
        counter = _counters.setdefault((kind, process_set_id), itertools.count())
        return f"{kind}.noname.{next(counter)}"


def forget(process_set_id=None):
    """Restarts the counts of one set id (a set was added under it), or of
    every set (init(): a re-formed job counts afresh on every rank, new ones
    included)."""
    with _lock:
        for key in [k for k in _counters if process_set_id is None or k[1] == process_set_id]:
            del _counters[key]
