"""Removes MPI's shared-memory files that a job left behind on this host.

MPICH unlinks its /dev/shm segments in MPI_Finalize. A rank killed by a
signal never gets there, and tfring skips MPI_Finalize on purpose after a
peer died (it would wait for the dead peer forever), so such jobs leave
``/dev/shm/mpich_shm_*`` files. (tfring's own segments are unlinked as soon
as every rank has mapped them.)

Other jobs, of this user or another, create and remove the same kind of
files at the same time, so a file is never judged by its name or by when it
appeared: tfringrun notes the files that its own ranks map while they run
(:func:`mapped_segments`, from ``/proc/PID/maps``), and once the job is
over removes those that no process maps any more (:func:`remove_leftovers`).
"""
import fnmatch
import glob
import os
import time

_PATTERNS = ("/dev/shm/mpich_shm_*",)


def is_mpi_segment(path):
    """Whether `path` names one of MPI's shared-memory files."""
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in _PATTERNS)


def _maps_paths(pid):
    """The /dev/shm files process `pid` maps (empty if it is gone or not ours to read)."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                # An unlinked file shows as "PATH (deleted)": it needs no cleanup.
                if len(fields) == 6 and fields[5].startswith("/dev/shm/") \
                        and not fields[5].rstrip().endswith("(deleted)"):
                    found.add(fields[5].rstrip("\n"))
    except OSError:
        pass
    return found


def mapped_segments(pids):
    """The MPI shared-memory files that any of `pids` maps now."""
    return {path for pid in pids for path in _maps_paths(pid) if is_mpi_segment(path)}


def _mapped_anywhere():
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        mapped |= _maps_paths(maps.split("/")[2])
    return mapped


def remove_leftovers(paths, wait=0.0):
    """Unlinks those of `paths` (files a finished job mapped) that still
    exist and that no process maps.

    A file still mapped is waited for, up to `wait` seconds: the job's last
    processes may still be on their way out (a SIGKILLed process keeps its
    mappings until the kernel has torn it down).

    Returns:
        (removed, left): the paths unlinked, and those left because some
        process still maps them.
    """
    deadline = time.monotonic() + wait
    removed = []
    todo = sorted(p for p in paths if os.path.exists(p))
    while todo:
        in_use = _mapped_anywhere()
        for path in [p for p in todo if p not in in_use]:
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
            except OSError:
                continue  # not ours to remove: leave it listed
            todo.remove(path)
        if not todo or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return removed, todo
