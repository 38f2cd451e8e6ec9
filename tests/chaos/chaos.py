"""A chaos run: elastic Keras training on fake hosts under a seeded schedule
of faults, checked after every round (issue 40; docs/elastic.md).

The job is ``tfringrun --host-discovery-script`` over fake hosts with network
stacks of their own (tests/netns_support.py), one slot each, with
tests/chaos/chaos_worker.py as the script. Each round injects one fault,
heals it the way an operator or a scheduler would, and waits until the job
is whole again and has made progress:

  kill     SIGKILL a worker; its host is then dropped from the discovery
           script and listed again (a replaced machine), which refills it
  stop     SIGSTOP a worker (silent to its peers, alive to the driver),
           SIGCONT it once the job has gone on without it; its host is
           then dropped and listed again
  cut      take a host off the network (its link down); the job goes on
           without it; the link comes back and the host is listed again
  add      list a host that was not listed: the job grows
  remove   drop a listed host: the job shrinks

After every round it checks, within ``bound`` seconds (stated in the
report): the launcher still runs; the job has trained on at the expected
size; every step's ranks hold equal weights (their digests agree); the
loss of every step so far is on the path of a one-process replay of the
same steps at the sizes they ran at (``rtol``); the launcher printed a line
naming the fault's worker or host; no Python traceback was printed.

At the end the job is told to stop, must exit 0 with equal final weights,
and no process, ``/dev/shm`` segment, network namespace or link (and so
no qdisc) of the run may be left. (The run's own: its processes carry its
tag, its segments a worker's pid, its namespaces and links its names; other
jobs on the machine, another test worker's, are not its to answer for.)
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(TESTS, "tensorflow"))

import elastic_worker  # noqa: E402
import memory_detail  # noqa: E402
import netns_support  # noqa: E402
from elastic_support import ElasticJob, leftovers, rank_lines, worker_pids  # noqa: E402

FAULTS = ("kill", "stop", "cut", "add", "remove")
WORKER = [sys.executable, os.path.join(HERE, "chaos_worker.py")]
MIN_NP = 2
PROGRESS_STEPS = 10     # steps the job must train at full size to end a round


class ChaosFailure(AssertionError):
    """A check of the chaos run failed; the message says which and when."""


# -- the reference --------------------------------------------------------

def initial_weights():
    """The model's weights before training (what every worker builds)."""
    model, _ = elastic_worker.build()
    return [v.numpy() for v in model.trainable_variables]


class Reference:
    """The loss on all the data after each step of a one-process replay:
    step s averages the gradients of the `sizes[s]` ranks' batches, then
    takes Keras 3's SGD step (lr, momentum 0.9), in float32 as TF does.

    It keeps where it got to, so a long run replays each step once (only a
    step whose size changed, the uncommitted last one, is replayed again)."""

    def __init__(self, weights):
        self.start = [np.array(w, np.float32) for w in weights]
        self.x, self.y = elastic_worker.data()
        self.sizes, self.losses, self.states = [], [], {}

    def _step(self, params, velocity, step, size):
        w1, b1, w2, b2 = params
        grads = [np.zeros_like(w) for w in params]
        for rank in range(size):
            idx = elastic_worker.batch_index(step, size, rank, len(self.x))
            xb, yb = self.x[idx], self.y[idx]
            h = np.tanh(xb @ w1 + b1)
            d_out = 2.0 * (h @ w2 + b2 - yb) / np.float32(len(idx))
            d_h = (d_out @ w2.T) * (1.0 - h * h)
            for g, part in zip(grads, (xb.T @ d_h, d_h.sum(0), h.T @ d_out, d_out.sum(0))):
                g += part.astype(np.float32)
        lr, momentum = np.float32(elastic_worker.LR), np.float32(0.9)
        velocity = [momentum * v - lr * (g / size) for v, g in zip(velocity, grads)]
        params = [(p + v).astype(np.float32) for p, v in zip(params, velocity)]
        w1, b1, w2, b2 = params
        out = np.tanh(self.x @ w1 + b1) @ w2 + b2
        return params, velocity, float(np.mean((out - self.y) ** 2))

    # Steps whose state is kept to go on from: a rollback only ever redoes
    # the last, uncommitted step, so a few are plenty.
    KEPT_STATES = 32

    def __call__(self, sizes):
        """The losses after each step of `sizes` (a list of sizes by step)."""
        keep = 0
        while keep < min(len(sizes), len(self.sizes)) and sizes[keep] == self.sizes[keep]:
            keep += 1
        if keep and keep - 1 not in self.states:
            keep = 0    # further back than the kept states: from the start
        del self.sizes[keep:], self.losses[keep:]
        for step in [s for s in self.states if s >= keep]:
            del self.states[step]
        if keep:
            params, velocity = self.states[keep - 1]
        else:
            params, velocity = self.start, [np.zeros_like(w) for w in self.start]
        for step in range(keep, len(sizes)):
            params, velocity, loss = self._step(params, velocity, step, sizes[step])
            self.sizes.append(sizes[step])
            self.losses.append(loss)
            self.states[step] = (params, velocity)
            self.states.pop(step - self.KEPT_STATES, None)
        return list(self.losses)


# -- reading the job's output ----------------------------------------------

class Progress:
    """What the workers' lines say so far; :meth:`read` takes in new lines."""

    def __init__(self):
        self.loss, self.size = {}, {}       # step -> the last value printed
        self.digests = {}                   # (step, size) -> {sha}
        self.finals = {}                    # worker id -> sha
        self.read_to = 0

    def read(self, lines):
        """Takes in `lines` (the job's (time, text) list) past what it read."""
        end = len(lines)
        for wid, text in rank_lines("\n".join(text for _, text in lines[self.read_to:end])):
            fields = text.split()
            if not fields:
                continue
            if fields[0] == "LOSS":
                self.loss[int(fields[1])] = float(fields[2])
            elif fields[0] == "SIZE":
                self.size[int(fields[1])] = int(fields[2])
            elif fields[0] == "DIGEST":
                self.digests.setdefault((int(fields[1]), int(fields[2])), set()).add(fields[3])
            elif fields[0] == "FINAL":
                self.finals[wid] = fields[2]
        self.read_to = end
        return self

    def last_step(self):
        return max(self.size, default=-1)


def _launcher_lines(output):
    """The driver's own lines (not a worker's)."""
    return [line for line in output.splitlines() if not re.match(r"\[\d+\]<", line)]


def _rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _shm_segments(pids):
    """tfring's shared-memory segments in /dev/shm created by any of `pids`
    (a segment's name is /tfring-<creator's pid>-...): the run's own, not
    those of other jobs on the machine (another test worker's)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    prefixes = tuple(f"tfring-{pid}-" for pid in pids)
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefixes)}


def _worker_pids(path):
    """The pids every worker of the run wrote to `path` as it started."""
    try:
        with open(path) as f:
            return {int(line) for line in f if line.strip()}
    except FileNotFoundError:
        return set()


class ChaosRun:
    """One chaos run. ``run()`` returns its report (a dict) or raises
    :class:`ChaosFailure` naming the check and the round.

    Args:
        workdir: a directory of its own (hosts file, fake ssh, stop file).
        seed: seeds the schedule (which fault, which host).
        hosts: fake hosts (3 or 4); all but one are listed at first.
        bound: seconds a round may take to be whole again and progress.
        rtol: how far a step's loss may be from the replay's (relative).
        step_sleep: seconds each worker sleeps between steps (how much CPU
            the training takes).
        log: called with a line for each event (default: none).
        memory_detail: also record, at each memory sample, where each
            worker's memory is (tests/chaos/memory_detail.py) and what
            changed since its last sample (the report's "memory_detail").
    """

    def __init__(self, workdir, seed, hosts=4, bound=120.0, rtol=1e-3, step_sleep=0.05,
                 log=None, memory_detail=False):
        if hosts < 3:
            raise ValueError("a chaos run needs 3 or more fake hosts")
        self.workdir = str(workdir)
        self.rng = random.Random(seed)
        self.seed, self.bound, self.rtol = seed, bound, rtol
        self.names = [f"c{i}" for i in range(hosts)]
        self.listed = self.names[:-1]
        self.log = log or (lambda line: None)
        self.rounds = []
        self.memory = {}        # worker id -> [(seconds since start, RSS kB)]
        self.t0 = None
        self.step_sleep = step_sleep
        self.detail_dir = os.path.join(self.workdir, "memory") if memory_detail else None
        self.detail = {}        # worker id -> [[t, RSS kB change, what changed]]
        self._last_detail = {}  # worker id -> its last breakdown

    # -- the job ---------------------------------------------------------
    def _listing(self):
        return "\n".join(f"{n}:1" for n in self.listed)

    def _set_listed(self, names):
        self.listed = [n for n in self.names if n in names]
        self.job.set_hosts(self._listing())

    def _progress(self):
        return self.progress.read(self.job.lines)

    def _worker_on(self, host):
        """The live worker id (and pid) on fake host `host`, or None."""
        pids = worker_pids(self.job)
        for wid, pid in pids.items():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if f"TFRING_HOSTNAME={host}".encode() in env:
                return wid, pid
        return None

    def _sample_memory(self):
        now = time.monotonic() - self.t0
        for wid, pid in worker_pids(self.job).items():
            rss = _rss_kb(pid)
            if rss is None:
                continue
            self.memory.setdefault(wid, []).append((round(now, 1), rss))
            if self.detail_dir:
                now_detail = memory_detail.sample(pid, self.detail_dir)
                before = self._last_detail.get(wid)
                if before is not None:
                    samples = self.memory[wid]
                    self.detail.setdefault(wid, []).append(
                        [round(now, 1), samples[-1][1] - samples[-2][1],
                         memory_detail.explain(before, now_detail)])
                self._last_detail[wid] = now_detail

    # -- the checks ------------------------------------------------------
    def _fail(self, what):
        raise ChaosFailure(f"round {len(self.rounds) + 1} (seed {self.seed}): {what}\n"
                           f"rounds so far: {json.dumps(self.rounds)}\n"
                           f"--- output (last 6000 chars) ---\n{self.job.output()[-6000:]}")

    def _wait_whole(self, since_step, started):
        """Waits until the job trains at the listed size for PROGRESS_STEPS
        steps past `since_step`; returns the seconds since `started`."""
        want = len(self.listed)
        while True:
            if self.job.proc.poll() is not None:
                self._fail(f"the launcher exited with {self.job.proc.returncode} "
                           f"while the job should go on at {want} ranks")
            p = self._progress()
            at_size = [s for s in p.size if s > since_step and p.size[s] == want]
            if at_size and p.last_step() >= min(at_size) + PROGRESS_STEPS:
                return time.monotonic() - started
            if time.monotonic() - started > self.bound:
                self._fail(f"not back at {want} ranks with {PROGRESS_STEPS} steps of "
                           f"progress within {self.bound:g} s")
            time.sleep(0.2)

    def _check_steps(self):
        p = self._progress()
        split = {k: v for k, v in p.digests.items() if len(v) > 1}
        if split:
            self._fail(f"ranks of the same step hold different weights: {split}")
        steps = sorted(p.size)
        if steps != list(range(len(steps))):
            self._fail(f"steps missing from rank 0's output: {sorted(set(range(len(steps))) - set(steps))}")
        no_loss = [s for s in steps if s not in p.loss]
        if no_loss:
            self._fail(f"steps with a SIZE line but no LOSS line from rank 0: {no_loss[:10]}")
        sizes = [p.size[s] for s in steps]
        ref = self.reference(sizes)
        worst = max((abs(p.loss[s] - ref[s]) / max(ref[s], 1e-6) for s in steps), default=0.0)
        if worst > self.rtol:
            bad = [s for s in steps if abs(p.loss[s] - ref[s]) / max(ref[s], 1e-6) > self.rtol]
            self._fail(f"the loss left the replay's path (rtol {self.rtol:g}) at steps "
                       f"{bad[:10]}: {[(p.loss[s], ref[s]) for s in bad[:3]]}")
        if "Traceback" in self.job.output():
            self._fail("a Python traceback was printed")
        return worst

    def _named(self, since_line, words):
        """The launcher's lines after line `since_line` that name any of
        `words` (each a tuple of words that must all be in the line)."""
        lines = _launcher_lines("\n".join(line for _, line in self.job.lines[since_line:]))
        return [line for line in lines if any(all(w in line for w in ws) for ws in words)]

    # -- the faults ------------------------------------------------------
    def _choose(self, used):
        busy = len(self.listed) >= 3
        feasible = []
        for fault in FAULTS:
            if fault in ("kill", "stop", "cut", "remove") and busy:
                feasible.append(fault)
            if fault == "add" and len(self.listed) < len(self.names):
                feasible.append(fault)
        fresh = [f for f in feasible if f not in used]
        return self.rng.choice(fresh or feasible)

    def _relist(self, hosts):
        """Drops `hosts` from the discovery script and lists them again, as
        replaced or repaired machines show up: the driver refills them."""
        self._set_listed([n for n in self.listed if n not in hosts])
        time.sleep(2.5)     # the driver runs the script every second
        self._set_listed(self.listed + list(hosts))

    def _whole_first(self):
        """Makes the job whole before a round's fault, and returns the hosts
        relisted for it (None when it already was). A worker can be lost
        after the last round was whole again: the driver stops a healthy
        peer that a survivor named late (docs/elastic.md allows it), and
        does not refill a slot it emptied itself until the discovery script
        changes. A fault injected then may hit a worker that is not in the
        job, which then never degrades. So, as a scheduler's discovery
        script would, hosts without a live worker are relisted, and the
        round records it."""
        p = self._progress()
        step = p.last_step()
        if p.size.get(step, len(self.listed)) >= len(self.listed):
            return None
        gone = [h for h in self.listed if self._worker_on(h) is None]
        if gone:
            self._relist(gone)
        self._wait_whole(step, time.monotonic())
        return gone

    def _round(self, fault):
        relisted = self._whole_first()
        p = self._progress()
        step_before = p.last_step()
        line_before = len(self.job.lines)
        started = time.monotonic()
        record = {"round": len(self.rounds) + 1, "fault": fault, "at_step": step_before,
                  "t": round(started - self.t0, 1)}
        if relisted is not None:
            record["whole_first"] = relisted
        if fault == "add":
            host = self.rng.choice([n for n in self.names if n not in self.listed])
            self._set_listed(self.listed + [host])
            named = [(host, "start")]
        elif fault == "remove":
            host = self.rng.choice(self.listed)
            self._set_listed([n for n in self.listed if n != host])
            named = [(host, "leaves")]
        else:
            candidates = [(h, self._worker_on(h)) for h in self.listed]
            candidates = [(h, w) for h, w in candidates if w is not None]
            if not candidates:
                self._fail("no live worker on a listed host to inject a fault into")
            host, (wid, pid) = self.rng.choice(candidates)
            record["worker"] = wid
            named = [(f"worker {wid}", host)]
            if fault == "kill":
                os.kill(pid, signal.SIGKILL)
            elif fault == "stop":
                os.kill(pid, signal.SIGSTOP)
            else:
                self.hosts.cut(host)
            # The job goes on without it first, at fewer ranks: one fewer,
            # or more when a survivor named a healthy peer too (the driver
            # then stops that one as well: docs/elastic.md).
            size_before = self._progress().size.get(step_before, len(self.listed))
            record["degraded_to"] = self._wait_degraded(step_before, size_before, started,
                                                        line_before)
            record["degraded_s"] = round(time.monotonic() - started, 1)
            if fault == "stop":
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            if fault == "cut":
                self.hosts.restore(host)
            # Every listed host that lost its worker is replaced, as a
            # scheduler's discovery script would do.
            others = [h for h in self.listed if h != host and self._worker_on(h) is None]
            if others:
                record["also_relisted"] = others
            self._relist([host] + others)
        record["host"] = host
        record["whole_s"] = round(self._wait_whole(step_before, started), 1)
        said = self._named(line_before, named)
        if not said:
            self._fail(f"no launcher line names the {fault} of {named}")
        record["said"] = said[:3]
        record["loss_rtol"] = float(f"{self._check_steps():.2e}")
        record["size"] = len(self.listed)
        self._sample_memory()
        self.rounds.append(record)
        self.log(json.dumps(record))

    def _wait_degraded(self, since_step, size_before, started, since_line):
        """Waits until the job trains on at fewer than `size_before` ranks
        (and at least MIN_NP) after `since_step`, and returns that size; or
        until the driver says it waits for slots below --min-np (a survivor
        named a healthy peer as well), and returns 0."""
        while True:
            if self.job.proc.poll() is not None:
                self._fail(f"the launcher exited with {self.job.proc.returncode} after the fault")
            p = self._progress()
            smaller = [p.size[s] for s in p.size if s > since_step and p.size[s] < size_before]
            if self._named(since_line, [("waiting for", "slot")]):
                return 0
            if smaller:
                if smaller[0] < MIN_NP:
                    self._fail(f"the job went on at {smaller[0]} ranks, below --min-np {MIN_NP}")
                return smaller[0]
            if time.monotonic() - started > self.bound:
                self._fail(f"the job did not go on at fewer than {size_before} ranks within "
                           f"{self.bound:g} s")
            time.sleep(0.2)

    # -- the run ---------------------------------------------------------
    def run(self, rounds=None, duration=None):
        """Runs `rounds` rounds (or rounds until `duration` seconds have
        passed); returns the report."""
        self.reference = Reference(initial_weights())
        self.progress = Progress()
        stop_file = os.path.join(self.workdir, "stop")
        pids_file = os.path.join(self.workdir, "worker-pids")
        bin_dir = os.path.join(self.workdir, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        if self.detail_dir:
            os.makedirs(self.detail_dir, exist_ok=True)
        from pathlib import Path
        code, output = None, ""
        with netns_support.FakeHosts(self.names) as hosts:
            self.hosts = hosts
            hosts.ssh_command(bin_dir)
            # The workers' temporary files in the run's directory: TensorFlow
            # leaves a file per autograph-converted function of every worker
            # the run kills (~70 a minute in /tmp otherwise).
            worker_tmp = os.path.join(self.workdir, "tmp")
            os.makedirs(worker_tmp, exist_ok=True)
            env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": worker_tmp,
                   "TFRING_HEARTBEAT_SECONDS": "1", "CHAOS_STOP_FILE": stop_file,
                   "CHAOS_PIDS_FILE": pids_file,
                   "CHAOS_STEP_SLEEP": str(self.step_sleep),
                   **({memory_detail.ENV: self.detail_dir} if self.detail_dir else {}),
                   "PYTHONPATH": os.pathsep.join(filter(None, [
                       os.path.dirname(TESTS), os.environ.get("PYTHONPATH")]))}
            total = (duration or 0) + (rounds or 0) * self.bound + 600
            self.job = ElasticJob(Path(self.workdir), self._listing(), WORKER, len(self.listed),
                                  MIN_NP, len(self.names), env=env, timeout=int(total),
                                  extra=["--network-interfaces", hosts.interfaces(),
                                         "--blacklist-cooldown-range", "1", "2"])
            with self.job:
                self.t0 = time.monotonic()
                self._wait_whole(-1, self.t0)
                self.log(f"started at {len(self.listed)} ranks in "
                         f"{time.monotonic() - self.t0:.1f} s")
                self._sample_memory()
                used = set()
                while True:
                    done = len(self.rounds)
                    if rounds is not None and done >= rounds:
                        break
                    if duration is not None and time.monotonic() - self.t0 >= duration:
                        break
                    fault = self._choose(used)
                    used.add(fault)
                    self._round(fault)
                open(stop_file, "w").close()
                code, output = self.job.finish()
            left = leftovers(self.job)
        p = self._progress()
        names = [hosts.namespace(n) for n in self.names]
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        report = {
            "seed": self.seed, "hosts": len(self.names), "bound_s": self.bound,
            "rtol": self.rtol, "rounds": self.rounds, "exit_code": code,
            "steps": p.last_step() + 1, "seconds": round(time.monotonic() - self.t0, 1),
            "final_ranks": len(p.finals), "final_weights_equal": len(set(p.finals.values())) == 1,
            "memory_kb": self.memory,
            **({"memory_detail": self.detail} if self.detail_dir else {}),
            "left": {"processes": left,
                     "shm": sorted(_shm_segments(_worker_pids(pids_file))),
                     "netns": [n for n in names if n in netns],
                     "links": [line.split(":")[1].strip() for line in links.splitlines()
                               if hosts.bridge in line or any(
                                   hosts.interface(n)[:-1] in line for n in self.names)]},
        }
        if code != 0:
            raise ChaosFailure(f"the job ended with exit code {code}:\n{output[-6000:]}")
        if not report["final_weights_equal"] or report["final_ranks"] != len(self.listed):
            raise ChaosFailure(f"final weights: {p.finals} (listed {self.listed})")
        if any(report["left"].values()):
            raise ChaosFailure(f"left behind: {report['left']}")
        return report


def memory_growth(memory, warm_samples=2):
    """{worker id: RSS growth in kB from its `warm_samples`-th sample to its
    last} for the workers sampled more than `warm_samples` times."""
    return {wid: samples[-1][1] - samples[warm_samples - 1][1]
            for wid, samples in memory.items() if len(samples) > warm_samples}
