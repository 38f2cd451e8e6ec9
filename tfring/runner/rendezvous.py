"""``tfring.runner.rendezvous``, the documented name (docs/wire.md) of the
rendezvous store's server and client: the module itself lives in
:mod:`tfring._store.rendezvous`, below the launcher, so that ranks reach (or
serve) the store without importing tfring.runner."""
import sys

from tfring._store import rendezvous

sys.modules[__name__] = rendezvous
