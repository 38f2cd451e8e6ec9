"""Removes MPI's shared-memory files that a job left behind on this host.

MPICH unlinks its /dev/shm segments in MPI_Finalize. A rank killed by a
signal never gets there, and tfring skips MPI_Finalize on purpose after a
peer died (it would wait for the dead peer forever), so such jobs leave
``/dev/shm/mpich_shm_*`` files. tfringrun takes a listing before the job and,
once every rank is gone, removes the new ones that no live process maps.
(tfring's own segments are unlinked as soon as every rank has mapped them.)
"""
import glob
import os

_PATTERNS = ("/dev/shm/mpich_shm_*",)


def snapshot():
    """The MPI shared-memory files present now."""
    return {path for pattern in _PATTERNS for path in glob.glob(pattern)}


def _mapped_paths():
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    if "/dev/shm/" in line:
                        mapped.add(line.split(None, 5)[-1].strip().replace(" (deleted)", ""))
        except OSError:
            continue  # the process ended, or is not ours to read
    return mapped


def remove_leftovers(before):
    """Unlinks files that appeared since `before` and no process maps; returns them."""
    new = snapshot() - before
    if not new:
        return []
    in_use = _mapped_paths()
    removed = []
    for path in sorted(new - in_use):
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed
