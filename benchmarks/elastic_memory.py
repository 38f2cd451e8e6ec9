"""Resident memory of one elastic TensorFlow worker through many resets
(issue 40, part 3: memory flat over the chaos run).

Runs ``tfringrun --min-np 1 --max-np 2 --host-discovery-script`` with
benchmarks/elastic_memory_worker.py and flips the discovery output between
``localhost:2`` and ``localhost:1``: each flip re-forms the job, so worker 0
(the oldest, always rank 0) goes through one reset per flip, alternately at
size 1 and 2, while the newest worker leaves or a new one joins. With
``--fault kill`` the other worker is SIGKILLed instead of removed (worker 0
then rolls back through the error path of a lost peer), and the host is
listed at one slot and again at two to refill it. Worker 0 first trains
``--steps-first`` steps without a reset (growth per step), then
``--settle`` steps after each reset before the next flip.

    python benchmarks/elastic_memory.py --resets 30 --mode keras \\
        --out benchmarks/results/elastic_memory.jsonl --label keras

Warm-up: the first reset at each size, and the first lost peer, cost once
(the size's connections and buffers, the first error path); growth is
counted from worker 0's sample ``--settle`` steps after reset
``--warmup-resets`` to the last such sample at the same size. The target is
issue 40's: at most 1 MB after warm-up, and here no growth per reset:
``--check`` exits 1 when the growth divided by the resets exceeds
``--per-reset-limit`` KB, in the resident set or in malloc's bytes in use
(memory leaked but never written, calloc'd, is not resident yet), or the
resident set grew by more than 1 MB.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "elastic_memory_worker.py")
TARGET_KB = 1024
_LINE = re.compile(r"^\[(\d+)\](?:<stdout>)?:?\s?(MEM|GCDIFF|TRACE|DONE|PID)\s?(.*)$")
_FIELDS = ("event", "reset", "step", "size", "rss_kb", "heap_kb", "mmap_kb", "py_kb",
           "objects")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resets", type=int, default=40, help="host flips (resets of worker 0)")
    p.add_argument("--mode", choices=("keras", "object"), default="keras")
    p.add_argument("--fault", choices=("remove", "kill"), default="remove",
                   help="how worker 0's peer goes: its slot removed, or SIGKILL")
    p.add_argument("--steps-first", type=int, default=200,
                   help="steps before the first flip (growth per step)")
    p.add_argument("--settle", type=int, default=25, help="steps after each reset")
    p.add_argument("--warmup-resets", type=int, default=2)
    p.add_argument("--trace", action="store_true",
                   help="tracemalloc and gc object counts in worker 0 (slower)")
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", help="append one JSON line with every sample here")
    p.add_argument("--label", default="default")
    p.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    p.add_argument("--per-reset-limit", type=float, default=8.0,
                   help="KB per reset allowed after warm-up with --check")
    return p.parse_args(argv)


class Job:
    """The tfringrun job and worker 0's lines."""

    def __init__(self, workdir, args):
        self.hosts = os.path.join(workdir, "hosts.txt")
        self.stop = os.path.join(workdir, "stop")
        self.set_hosts("localhost:2")
        cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", "2", "--min-np", "1",
               "--max-np", "2", "--host-discovery-script", f"cat {self.hosts}",
               "--timeout", str(int(args.timeout)), "--blacklist-cooldown-range", "0.5", "1",
               sys.executable, WORKER]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "ELASTIC_MEMORY_MODE": args.mode,
               "ELASTIC_MEMORY_STOP": self.stop, "ELASTIC_MEMORY_EVERY": "5"}
        if args.trace:
            env["ELASTIC_MEMORY_TRACE"] = "1"
        self.samples, self.notes, self.output, self.pids = [], [], [], {}
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def set_hosts(self, text):
        with open(self.hosts + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(self.hosts + ".tmp", self.hosts)

    def _read(self):
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            m = _LINE.match(line)
            with self.cond:
                self.output.append(line)
                if m and m.group(2) == "PID":
                    self.pids[int(m.group(1))] = int(m.group(3))
                if m and m.group(1) == "0":
                    if m.group(2) == "MEM":
                        values = m.group(3).split()
                        sample = dict(zip(_FIELDS, [values[0]] + [int(v) for v in values[1:]]))
                        sample["t"] = round(time.monotonic(), 2)
                        self.samples.append(sample)
                    elif m.group(2) in ("GCDIFF", "TRACE"):
                        self.notes.append(f"{m.group(2)} {m.group(3)}")
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait(self, predicate, timeout):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self.samples):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    tail = "\n".join(self.output[-40:])
                    raise RuntimeError(f"worker 0 did not get there in time:\n{tail}")
                self.cond.wait(0.5)

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _resets(samples):
    return [s for s in samples if s["event"] == "reset"]


def run(args):
    with tempfile.TemporaryDirectory(prefix="tfring-elastic-memory-") as workdir:
        job = Job(workdir, args)
        try:
            job.wait(lambda s: any(x["step"] >= args.steps_first for x in s), args.timeout)
            for flip in range(args.resets):
                if flip % 2 == 1:
                    job.set_hosts("localhost:2")
                elif args.fault == "remove":
                    job.set_hosts("localhost:1")
                else:
                    os.kill(job.pids[max(job.pids)], signal.SIGKILL)
                job.wait(lambda s: len(_resets(s)) > flip, 180)
                if args.fault == "kill" and flip % 2 == 0:
                    # The line must change for the driver to refill the slot,
                    # and the driver must see it (it runs the script each second).
                    job.set_hosts("localhost:1")
                    time.sleep(2.5)
                at = _resets(job.samples)[-1]["step"]
                job.wait(lambda s: s[-1]["step"] >= at + args.settle, 180)
            with open(job.stop, "w"):
                pass
            job.proc.wait(120)
        finally:
            job.kill()
        return job.proc.returncode, job.samples, job.notes, job.output


def settled(samples, settle):
    """Per reset: worker 0's last sample within `settle` steps after it."""
    out, current, at = [], None, None
    for s in samples:
        if s["event"] == "reset":
            if current is not None:
                out.append(current)
            current, at = None, s["step"]
        elif s["event"] == "steps" and at is not None and s["step"] <= at + settle:
            current = s
    if current is not None:
        out.append(current)
    return out


def summarise(args, samples):
    first = [s for s in samples if s["event"] == "steps" and s["reset"] == 0]
    per_reset = settled(samples, args.settle)
    w = args.warmup_resets
    lines = []
    result = {"label": args.label, "mode": args.mode, "resets": len(_resets(samples)),
              "warmup_resets": w, "settle_steps": args.settle}
    if len(first) >= 2:
        a, b = first[len(first) // 4], first[-1]
        result["per_step_bytes"] = round((b["rss_kb"] - a["rss_kb"]) * 1024 /
                                         max(1, b["step"] - a["step"]), 1)
        lines.append(f"before any reset: RSS {a['rss_kb'] / 1024:.1f} MB at step {a['step']} "
                     f"-> {b['rss_kb'] / 1024:.1f} MB at step {b['step']} "
                     f"({result['per_step_bytes']:+.1f} B per step)")
    after = per_reset[w - 1:] if w >= 1 else per_reset
    same = [s for s in after if s["size"] == after[0]["size"]] if after else []
    if len(same) >= 2:
        base, last = same[0], same[-1]
        n = last["reset"] - base["reset"]
        for key in ("rss_kb", "heap_kb", "mmap_kb", "py_kb", "objects"):
            result[f"growth_{key}"] = last[key] - base[key]
        result["per_reset_kb"] = round(result["growth_rss_kb"] / max(1, n), 2)
        result["heap_per_reset_kb"] = round(result["growth_heap_kb"] / max(1, n), 2)
        lines.append(f"after warm-up (reset {base['reset']} -> {last['reset']}, {n} resets): "
                     f"RSS {base['rss_kb'] / 1024:.1f} -> {last['rss_kb'] / 1024:.1f} MB "
                     f"({result['growth_rss_kb']:+d} KB, {result['per_reset_kb']:+.1f} KB per "
                     f"reset); malloc in use {result['growth_heap_kb']:+d} KB, mmapped "
                     f"{result['growth_mmap_kb']:+d} KB, traced Python "
                     f"{result['growth_py_kb']:+d} KB, objects {result['growth_objects']:+d}")
    lines.append("reset size rss_kb heap_kb mmap_kb py_kb objects (each reset's settled sample)")
    for s in per_reset:
        lines.append(f"  {s['reset']:3d} {s['size']} {s['rss_kb']} {s['heap_kb']} {s['mmap_kb']} "
                     f"{s['py_kb']} {s['objects']}")
    result["per_reset"] = [{k: s[k] for k in ("reset", "size", "rss_kb", "heap_kb", "mmap_kb",
                                              "py_kb", "objects")} for s in per_reset]
    return result, lines


def missed_target(result, per_reset_limit):
    """Why `result` misses the target, or None."""
    if "per_reset_kb" not in result:
        return "too few resets after warm-up to tell"
    for key, what in (("per_reset_kb", "resident set"), ("heap_per_reset_kb", "malloc in use")):
        if result[key] > per_reset_limit:
            return f"{what} grew {result[key]:.1f} KB per reset (limit {per_reset_limit:g})"
    if result["growth_rss_kb"] > TARGET_KB:
        return f"resident set grew {result['growth_rss_kb']} KB after warm-up (limit {TARGET_KB})"
    return None


def main(argv=None):
    args = parse_args(argv)
    started = time.monotonic()
    code, samples, notes, output = run(args)
    result, lines = summarise(args, samples)
    result["exit_code"] = code
    result["seconds"] = round(time.monotonic() - started)
    result["load_average_end"] = os.getloadavg()
    print("\n".join(lines + notes))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    if code != 0:
        print("\n".join(output[-60:]))
        print(f"tfringrun exited with {code}")
        return 1
    if args.check:
        missed = missed_target(result, args.per_reset_limit)
        if missed:
            print(f"memory target missed: {missed}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
