"""The job's processes: the launch modes that start the ranks
(:class:`MpiexecLaunch`, :class:`RankProcessesLaunch`), the process trees
under them (read from ``/proc``), signals to processes and their groups, and
how a process ended in words. :mod:`tfring.runner.supervisor` decides what
to do with them; the elastic driver (:mod:`tfring.runner.elastic.driver`)
uses the same pieces for its workers."""
import os
import signal
import subprocess

from tfring.runner import remote


def format_ranks(ranks):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    ranks = sorted(ranks)
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(parts)


def describe_exit(code):
    """A wrapper's exit CODE as (words for the message, shell exit code).

    3 -> ("exited with code 3", 3); -9 -> ("was killed by signal 9 (SIGKILL)", 137).
    """
    if code >= 0:
        return f"exited with code {code}", code
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}", 128 - code


def process_table():
    """{pid: (ppid, process group)} of every live process, from /proc (empty elsewhere)."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # The command name is in parentheses and may contain spaces.
                fields = f.read().rpartition(b")")[2].split()
            if fields[0] not in (b"Z", b"X"):
                table[int(entry)] = (int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(roots, table=None):
    """Pids of every process under any of ``roots``."""
    table = process_table() if table is None else table
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_process(pid, signum, group=False):
    try:
        if group:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except OSError:
        pass


def signal_group_and_leader(pid, signum):
    """Sends `signum` to the process group `pid` leads, and to `pid` itself
    (which may have left its group); a process already gone is no error."""
    signal_process(pid, signum, group=True)
    signal_process(pid, signum)


class MpiexecLaunch:
    """Launch mode: one mpiexec process starts every rank (the MPI controller).

    Args:
        cmd: mpiexec's command line, rank wrapper and user command included.
    """

    def __init__(self, cmd):
        self.cmd = list(cmd)
        self.proc = None

    def start(self, env):
        """Starts mpiexec with `env` (the token included; hydra passes it on)."""
        self.proc = subprocess.Popen(self.cmd, env=env, start_new_session=True)

    def started(self):
        return self.proc is not None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def roots(self):
        """Pids of the processes this mode started and that are still there."""
        return [self.proc.pid] if self.running() else []

    def stop_unstarted(self, ranks):
        # Ranks without a connection cannot be told; hydra passes SIGTERM on.
        if self.running():
            self.proc.send_signal(signal.SIGTERM)

    def kill(self):
        for pid in self.roots():
            signal_process(pid, signal.SIGKILL)

    def wait(self):
        if self.proc is not None:
            self.proc.wait()

    def ended_without_rank(self):
        """[(rank, code, what)] of launch processes that ended on their own
        behalf; mpiexec's end is no one rank's."""
        return []

    def failure(self, not_started):
        """(exit code, message) when the mode itself failed, or None."""
        code = self.proc.returncode
        if code == 0:
            return None
        detail = f" before ranks {format_ranks(not_started)} started" if not_started else ""
        return (code if code > 0 else 128 - code, f"mpiexec exited with code {code}{detail}.")


class RankSpec:
    """One rank's process for :class:`RankProcessesLaunch`.

    Args:
        rank: the rank it runs.
        argv: the command line: the rank wrapper, or ssh running one remotely.
        env: variables added to the job's environment for this rank.
        remote: the process is ssh: it runs with tfringrun's own environment,
            and the rank's environment (job token and secret included) goes
            to the remote wrapper through ssh's stdin, never on a command line.
        what: how messages name the process, e.g. "ssh host2".
    """

    def __init__(self, rank, argv, env=None, remote=False, what="its wrapper"):
        self.rank, self.argv, self.env = rank, list(argv), dict(env or {})
        self.remote, self.what = remote, what
        self.proc = None
        self.reported = False


class RankProcessesLaunch:
    """Launch mode: tfringrun starts one process per rank itself (the TCP
    controller): a local rank wrapper, or ssh running a remote one. Each leads
    its own session and process group.

    Args:
        specs: one :class:`RankSpec` per rank.
    """

    def __init__(self, specs):
        self.specs = list(specs)

    def start(self, env):
        """Starts every rank's process; `env` is the job's environment (the
        token included). A process that cannot be started counts as a rank
        that ended before it started (127: no such program, else 126)."""
        for spec in self.specs:
            full = dict(env, **spec.env)
            try:
                spec.proc = subprocess.Popen(
                    spec.argv, env=None if spec.remote else full, start_new_session=True,
                    stdin=subprocess.PIPE if spec.remote else subprocess.DEVNULL)
            except OSError as e:
                spec.proc = _Failed(127 if isinstance(e, FileNotFoundError) else 126, e)
                continue
            if spec.remote:
                # A thread: ssh may not read before it connected, and a large
                # environment must not block the supervision loop meanwhile.
                remote.send_environment(spec.proc, full)

    def started(self):
        return any(spec.proc is not None for spec in self.specs)

    def running(self):
        return any(spec.proc is not None and spec.proc.poll() is None for spec in self.specs)

    def roots(self):
        return [spec.proc.pid for spec in self.specs
                if spec.proc is not None and spec.proc.poll() is None]

    def stop_unstarted(self, ranks):
        for spec in self.specs:
            if spec.rank in ranks and spec.proc is not None and spec.proc.poll() is None:
                signal_process(spec.proc.pid, signal.SIGTERM, group=True)

    def kill(self):
        for pid in self.roots():
            signal_group_and_leader(pid, signal.SIGKILL)

    def wait(self):
        for spec in self.specs:
            if spec.proc is not None:
                spec.proc.wait()

    def ended_without_rank(self):
        """[(rank, code, what)] for each process that ended since the last
        call (each is reported once); the supervisor decides whether its rank
        had already told how it ended."""
        ended = []
        for spec in self.specs:
            if spec.proc is not None and not spec.reported and spec.proc.poll() is not None:
                spec.reported = True
                ended.append((spec.rank, spec.proc.returncode, spec.what))
        return ended

    def failure(self, not_started):
        return None  # every process is one rank's, judged as that rank


class _Failed:
    """Stands in for a process that could not be started."""

    def __init__(self, code, error):
        self.returncode, self.error, self.pid = code, error, None

    def poll(self):
        return self.returncode

    def wait(self):
        return self.returncode
