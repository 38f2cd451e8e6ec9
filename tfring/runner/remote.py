"""What running a rank on another host takes: the ssh command line, the
environment a remote rank gets (sent over ssh's stdin, never on a command
line), and the fake host names (``TFRING_HOSTNAME=a,a,b``) that stand in for
hosts on one machine. Used by tfringrun's TCP mode, the elastic driver, Ray
and Spark."""
import json
import os
import shlex
import threading


def ssh_command(host, remote_command, port=None, identity_file=None):
    """The argv that runs `remote_command` (a list) on `host` over ssh, from
    this directory. BatchMode: a host that would ask for a password or an
    unknown host key fails at once instead of waiting for an answer that
    never comes (stdin carries the rank's environment)."""
    cmd = ["ssh", "-o", "BatchMode=yes"]
    if port is not None:
        cmd += ["-p", str(port)]
    if identity_file:
        cmd += ["-i", os.path.abspath(os.path.expanduser(identity_file))]
    return cmd + [host, f"cd {shlex.quote(os.getcwd())} && exec {shlex.join(remote_command)}"]


def fake_host_names(env=os.environ):
    """The per-rank host names of ``TFRING_HOSTNAME=a,a,b`` (alias
    ``HOROVOD_HOSTNAME``), which fakes hosts on one machine (rank r is on the
    r-th; ranks past the list on this machine); None for a single name or none.
    Under MPI the core picks its name by rank; under TCP a rank knows its
    rank only after the rendezvous, so tfringrun hands each its own name."""
    value = env.get("TFRING_HOSTNAME") or env.get("HOROVOD_HOSTNAME") or ""
    return [n.strip() for n in value.split(",")] if "," in value else None


# Variables that describe the launching host or session, not the job: a
# remote rank keeps its own.
_HOST_VARIABLES = {"HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "DISPLAY", "XAUTHORITY",
                   "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", "TMUX",
                   "TERM_SESSION_ID"}


def remote_environment(env):
    """The environment a remote rank gets: the job's, minus what belongs to
    this host or session (as hydra also forwards the whole environment)."""
    return {k: v for k, v in env.items() if k not in _HOST_VARIABLES}


def send_environment(proc, env):
    """Writes the remote environment of `env` (JSON, one line) to the stdin
    of `proc` (ssh running a rank wrapper with --env-stdin), from a thread:
    ssh may not read before it connected, and a large environment must not
    block the caller meanwhile."""
    data = json.dumps(remote_environment(env)).encode() + b"\n"
    threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True).start()


def _feed(pipe, data):
    try:
        pipe.write(data)
        pipe.close()
    except OSError:
        pass  # the process ended already; its exit code tells why
