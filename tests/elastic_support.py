"""Running elastic jobs in tests: tfringrun with a discovery script that
prints a file the test rewrites, with a timeout and nothing left behind."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

from support import ROOT, rank_lines  # noqa: F401  (rank_lines: for the tests)


class ElasticJob:
    """One ``tfringrun --host-discovery-script`` job, started by :meth:`start`.

    Args:
        tmp_path: where the hosts file lives.
        hosts: the discovery script's first output, e.g. "localhost:3".
        command: the worker command (a list).
        np_, min_np, max_np: tfringrun's sizes.
        extra: more tfringrun options.
        env: more environment for the workers.
        timeout: seconds; tfringrun's --timeout, and the test's own bound.
    """

    def __init__(self, tmp_path, hosts, command, np_, min_np, max_np, extra=(), env=None,
                 timeout=240):
        self.hosts_file = tmp_path / "hosts.txt"
        self.set_hosts(hosts)
        self.timeout = timeout
        self.cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_),
                    "--min-np", str(min_np), "--max-np", str(max_np),
                    "--host-discovery-script", f"cat {self.hosts_file}",
                    "--timeout", str(timeout), "--verbose", *extra, *command]
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "ELASTIC_TEST_TAG": self.tag,
                    **(env or {})}
        self.lines = []
        self.proc = None
        self._reader = None
        self._cond = threading.Condition()

    def set_hosts(self, text):
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, self.hosts_file)  # the driver never reads half a file

    def start(self):
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()

    def wait_for(self, pattern, timeout=120):
        """Waits for an output line matching `pattern`; returns its match."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for _, line in self.lines[seen:]:
                    m = regex.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"no line matching {pattern!r}:\n{self.output()}")
                self._cond.wait(min(left, 0.5))

    def finish(self):
        """Waits for the job; returns (exit code, output)."""
        try:
            self.proc.wait(self.timeout + 60)
        finally:
            self.kill()
        self._reader.join(10)
        return self.proc.returncode, self.output()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def output(self):
        return "\n".join(line for _, line in self.lines)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()


def tagged_processes(job):
    """[(pid, worker id or None, is_wrapper)] of every live process that
    carries this job's tag (tfringrun itself excluded)."""
    found = []
    tag = job.tag.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or (job.proc is not None and int(entry) == job.proc.pid):
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rpartition(b")")[2].split()[0] == b"Z":
                    continue
        except OSError:
            continue
        if env.get(b"ELASTIC_TEST_TAG") != tag:
            continue
        wid = env.get(b"TFRING_ELASTIC_WORKER")
        found.append((int(entry), None if wid is None else int(wid), b"rank_wrapper" in cmdline))
    return found


def worker_pids(job):
    """{worker id: pid} of the job's running worker commands."""
    return {wid: pid for pid, wid, wrapper in tagged_processes(job)
            if wid is not None and not wrapper}


def leftovers(job, wait=10.0):
    """Processes of the job still alive `wait` seconds after it ended."""
    deadline = time.monotonic() + wait
    while True:
        left = tagged_processes(job)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)
