"""``tfring.runner.wire``, the documented name (docs/wire.md) of the wire's
framing and secrets: the module itself lives in :mod:`tfring._store.wire`,
below the launcher, so that ranks use it without importing tfring.runner."""
import sys

from tfring._store import wire

sys.modules[__name__] = wire
