"""Builds the MPICH hydra ``mpiexec`` command line for a tfringrun job.

The ``mpich`` wheel installs ``mpiexec`` (hydra) next to the Python
interpreter, and tfring links against that MPICH, so that is the launcher to
use: another MPI's ``mpiexec`` found first on PATH (Open MPI's, say) would
start ranks that cannot talk to each other.

Mapping from tfringrun's options to hydra's:

* host list -> ``-hosts a:4,b:4`` (ranks fill slots in order), ``-n N``;
* every host local -> ``-launcher fork``, so a one-machine job never needs ssh;
* ``-p``/``-i`` -> ``-launcher ssh -launcher-exec SHIM``, where SHIM is a small
  script running ``ssh -p PORT -i FILE "$@"`` (hydra takes the launcher as
  one path, not as a command line with arguments);
* ``--network-interfaces`` -> ``-iface`` (hydra takes a single interface);
* exported variables -> ``-genv NAME VALUE``, which reach remote ranks too;
* ``--mpi-args`` -> appended verbatim before the rank command.
"""
import os
import shlex
import shutil
import sys

from tfring.runner import hosts as hosts_mod


class MpiexecNotFound(RuntimeError):
    pass


def find_mpiexec():
    """The mpiexec next to this Python (the mpich wheel's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpiexec")
    if found:
        return found
    raise MpiexecNotFound(
        "tfringrun: mpiexec was not found next to the Python interpreter "
        f"({os.path.dirname(sys.executable)}) nor on PATH. Install MPICH with "
        "`pip install mpich mpi4py`.")


def write_ssh_shim(directory, port=None, identity_file=None):
    """Writes the ssh wrapper hydra runs for remote hosts; returns its path."""
    args = ["ssh"]
    if port is not None:
        args += ["-p", str(port)]
    if identity_file:
        args += ["-i", os.path.abspath(os.path.expanduser(identity_file))]
    path = os.path.join(directory, "ssh")
    with open(path, "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\nexec " + shlex.join(args) + ' "$@"\n')
    os.chmod(path, 0o700)
    return path


def build_command(mpiexec, hosts, num_proc, env, rank_command, *, ssh_shim=None,
                  network_interface=None, mpi_args=()):
    """Returns the argv for mpiexec.

    Args:
        mpiexec: path to hydra's mpiexec.
        hosts: list of hosts.Host; ranks fill their slots in order.
        num_proc: number of ranks.
        env: variables to export to every rank.
        rank_command: what each rank runs (the rank wrapper plus the user command).
        ssh_shim: path from write_ssh_shim(), for jobs with remote hosts.
        network_interface: interface name for hydra's own traffic.
        mpi_args: extra mpiexec arguments, passed through verbatim.
    """
    used = [h for h in hosts if h.name in hosts_mod.assign_ranks(hosts, num_proc)]
    cmd = [mpiexec, "-n", str(num_proc), "-hosts", ",".join(str(h) for h in used)]
    if all(hosts_mod.is_local(h.name) for h in used):
        cmd += ["-launcher", "fork"]
    elif ssh_shim:
        cmd += ["-launcher", "ssh", "-launcher-exec", ssh_shim]
    if network_interface:
        cmd += ["-iface", network_interface]
    for name, value in env.items():
        cmd += ["-genv", name, value]
    cmd += list(mpi_args)
    return cmd + list(rank_command)
