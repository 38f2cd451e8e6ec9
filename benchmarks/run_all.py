"""Runs the whole benchmark suite, then writes benchmarks/RESULTS.md and plots.

Usage (from the repository root, in the environment tfring is installed in)::

    python benchmarks/run_all.py            # full run, about 8-12 minutes on 2 idle cores
    python benchmarks/run_all.py --quick    # smoke run, about 3-5 minutes
    python benchmarks/run_all.py --only collectives,training
    python benchmarks/run_all.py --only small,independent,training,profile   # issue 10's rows
    python benchmarks/run_all.py --report-only

(``bash benchmarks/run_all.sh`` is the same.) Every launch goes through
``tfringrun`` with ``--timeout`` and a hard subprocess timeout on top. Each
script appends JSON lines to ``benchmarks/results/<part>.jsonl`` (a part's
old file is removed before the part runs); each launch's full output goes to
``benchmarks/results/logs/<name>.log``; the commands, exit codes and times
to ``results/commands.jsonl``; the machine description to
``results/machine.json``. ``report.py`` then turns them into RESULTS.md and
the PNG plots (plots need matplotlib).
"""
import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_common as bc  # noqa: E402

PARTS = ("idle", "small", "collectives", "independent", "training", "profile")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes and durations")
    p.add_argument("--only", help="comma-separated subset of " + ",".join(PARTS))
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--report", default=os.path.join(HERE, "RESULTS.md"),
                   help="where report.py writes the Markdown")
    p.add_argument("--report-only", action="store_true", help="only rerun report.py")
    p.add_argument("--max-bytes", help="cap for the collective sweep, e.g. 64M")
    p.add_argument("--nps", default="2,3", help="rank counts for the collective sweep")
    p.add_argument("--planes", default="auto,mpi",
                   help="TFRING_CPU_OPERATIONS values for the collective sweep "
                        "('auto' leaves it unset)")
    p.add_argument("--training-seconds", type=float, help="measured phase per training run")
    p.add_argument("--training-reps", type=int, default=3,
                   help="interleaved repetitions of (np=2, ceiling) in the training part")
    return p.parse_args(argv)


class Runner:
    def __init__(self, args):
        self.args = args
        self.results = os.path.abspath(args.results_dir)
        self.logs = os.path.join(self.results, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.commands = os.path.join(self.results, "commands.jsonl")
        launcher = shutil.which("tfringrun", path=os.path.dirname(sys.executable))
        self.launcher = [launcher] if launcher else [sys.executable, "-m", "tfring.runner.launch"]
        self.failures = []

    def command(self, np_, timeout, script, script_args):
        return [*self.launcher, "-np", str(np_), "--timeout", str(int(timeout)),
                sys.executable, os.path.join("benchmarks", script), *script_args]

    @staticmethod
    def display(cmd, env_over):
        words = ["python" if w == sys.executable else
                 ("tfringrun" if w.endswith("/tfringrun") else w) for w in cmd]
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env_over.items())
        return (prefix + " " if prefix else "") + " ".join(shlex.quote(w) for w in words)

    def start(self, name, np_, timeout, script, script_args, env_over=None):
        env_over = env_over or {}
        cmd = self.command(np_, timeout, script, script_args)
        env = dict(os.environ, **env_over)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        shown = self.display(cmd, env_over)
        print(f"\n=== {name}: {shown}", flush=True)
        log = open(os.path.join(self.logs, f"{name}.log"), "w")
        log.write(f"# {shown}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        return {"name": name, "proc": proc, "log": log, "shown": shown, "timeout": timeout,
                "start": time.monotonic(), "np": np_, "env": env_over}

    def finish(self, job, echo=True):
        proc = job["proc"]
        # tfringrun's own --timeout should end the job first; this is the backstop.
        killed = threading.Event()

        def kill():
            killed.set()
            proc.kill()
        remaining = job["start"] + job["timeout"] + 60 - time.monotonic()
        watchdog = threading.Timer(max(1.0, remaining), kill)
        watchdog.start()
        try:
            for line in proc.stdout:
                job["log"].write(line)
                if echo and line.startswith("[0]<stdout>:"):
                    print("  " + line[len("[0]<stdout>:"):].rstrip(), flush=True)
            rc = proc.wait()
        finally:
            watchdog.cancel()
        if killed.is_set():
            rc = "killed (timeout)"
        wall = time.monotonic() - job["start"]
        job["log"].close()
        rec = {"name": job["name"], "command": job["shown"], "np": job["np"], "rc": rc,
               "wall_s": round(wall, 1), "time": bc.now_iso()}
        bc.append_jsonl(self.commands, [rec])
        status = "ok" if rc == 0 else f"FAILED ({rc}); see {os.path.relpath(job['log'].name)}"
        print(f"=== {job['name']}: {status} in {wall:.0f} s", flush=True)
        if rc != 0:
            self.failures.append(job["name"])
        return rc

    def run(self, *a, **kw):
        return self.finish(self.start(*a, **kw))

    def out(self, part):
        return os.path.relpath(os.path.join(self.results, f"{part}.jsonl"), ROOT)

    def clear(self, part):
        path = os.path.join(self.results, f"{part}.jsonl")
        if os.path.exists(path):
            os.remove(path)


def run_idle(r, quick):
    r.clear("idle")
    args = ["--out", r.out("idle")] + (["--quick"] if quick else [])
    r.run("idle_np2", 2, 120, "idle_cpu.py", args)


def run_small(r, quick):
    r.clear("small_tensors")
    args = ["--out", r.out("small_tensors")] + (["--quick"] if quick else [])
    r.run("small_np2_cache_on", 2, 300, "small_tensors.py", args)
    r.run("small_np2_cache_off", 2, 300, "small_tensors.py", args,
          {"TFRING_CACHE_CAPACITY": "0"})


CHAIN = 10


def run_collectives(r, quick, nps, planes, max_bytes):
    r.clear("collectives")
    for np_ in nps:
        for plane in planes:
            args = ["--out", r.out("collectives"), "--label", plane]
            if quick:
                args.append("--quick")
            if max_bytes:
                args += ["--max-bytes", max_bytes]
            env = {} if plane == "auto" else {"TFRING_CPU_OPERATIONS": plane}
            r.run(f"collectives_np{np_}_{plane}", np_, 240 if quick else 600,
                  "collectives.py", args, env)
        # Per op, with TF's per-call cost spread over a chain (issue 10's
        # 1 MB, broadcast and allgather rows are also read this way).
        args = ["--out", r.out("collectives"), "--chain", str(CHAIN),
                "--sizes", "1M" if quick else "1M,4M,16M,64M"]
        if quick:
            args.append("--quick")
        if max_bytes:
            args += ["--max-bytes", max_bytes]
        r.run(f"collectives_np{np_}_chain{CHAIN}", np_, 240 if quick else 600,
              "collectives.py", args, {})


def run_training(r, quick, seconds, reps):
    """np=1 once, then `reps` interleaved pairs of (np=2, the ceiling).

    The ceiling is two independent single-rank trainings at once. On a shared
    machine the load drifts between launches, so each np=2 run is compared
    with the ceiling run right next to it (the order alternates from one
    repetition to the next, so a steady drift favours neither) and the report
    takes the median of the per-repetition ratios.
    """
    r.clear("training")
    args = []
    if quick:
        args.append("--quick")
    if seconds:
        args += ["--seconds", str(seconds)]
    timeout = 180 if quick else 300
    merged = os.path.join(r.results, "training.jsonl")

    def collect(parts, rep, load_before):
        load_after = os.getloadavg()[0]
        with open(merged, "a") as out:
            for i, part in enumerate(parts):
                for rec in bc.read_jsonl(os.path.join(r.results, f"{part}.jsonl")):
                    rec.update(job=i, rep=rep, load_before=load_before, load_after=load_after)
                    out.write(json.dumps(rec, sort_keys=True) + "\n")
                r.clear(part)

    def single(label, np_, rep):
        part = f"training_{label}_{rep}"
        r.clear(part)
        load = os.getloadavg()[0]
        r.run(f"training_{label}_rep{rep}", np_, timeout, "training.py",
              ["--out", r.out(part), "--label", label] + args)
        collect([part], rep, load)

    def ceiling(rep):
        sync = os.path.relpath(os.path.join(r.results, "logs", f"indep_rendezvous_{rep}"), ROOT)
        shutil.rmtree(sync, ignore_errors=True)
        # Two single-rank jobs at once, no communication between them; separate
        # output files so their lines cannot interleave, merged afterwards.
        jobs, parts = [], []
        load = os.getloadavg()[0]
        for tag in ("a", "b"):
            part = f"training_indep_{tag}_{rep}"
            r.clear(part)
            parts.append(part)
            jobs.append(r.start(f"training_indep_{tag}_rep{rep}", 1, timeout, "training.py",
                                ["--out", r.out(part), "--label", "indep", "--sync-dir", sync,
                                 "--sync-count", "2"] + args))
        for job in jobs:
            r.finish(job, echo=job is jobs[0])
        collect(parts, rep, load)
        shutil.rmtree(sync, ignore_errors=True)

    single("np1", 1, 0)
    for rep in range(reps):
        if rep % 2 == 0:
            single("np2", 2, rep)
            ceiling(rep)
        else:
            ceiling(rep)
            single("np2", 2, rep)


def run_independent(r, quick, nps):
    r.clear("independent")
    args = ["--out", r.out("independent")]
    if quick:
        args += ["--iters", "5", "--warmup", "2"]
    for np_ in nps:
        r.run(f"independent_np{np_}", np_, 300, "independent.py", args)


def run_profile(r, quick, seconds):
    """Training with CPU accounting per thread (the step breakdown's numbers)."""
    r.clear("profile")
    args = ["--out", r.out("profile"), "--profile"]
    if quick:
        args.append("--quick")
    else:
        args += ["--seconds", str(seconds or 15)]
    timeline = os.path.join(r.logs, "profile_np2_timeline.json")
    for np_ in (1, 2):
        env = {"TFRING_TIMELINE": timeline} if np_ == 2 else {}
        r.run(f"profile_np{np_}", np_, 300, "training.py", args + ["--label", f"profile_np{np_}"],
              env)
    if os.path.exists(timeline):
        subprocess.run([sys.executable, os.path.join(HERE, "step_timeline.py"), timeline,
                        "--out", os.path.join(r.results, "profile.jsonl"),
                        "--skip", "3" if quick else "20"], cwd=ROOT, timeout=300)
        os.remove(timeline)  # large; the numbers are in profile.jsonl


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - best effort description
        return f"unavailable ({exc})"


def machine_info(quick, started, finished):
    probe = ("import json, importlib.metadata as md, tensorflow as tf, numpy, mpi4py;"
             "from mpi4py import MPI;"
             "v = lambda p: (md.version(p) if p else None);"
             "print(json.dumps({'tensorflow': tf.__version__, 'keras': tf.keras.__version__,"
             " 'numpy': numpy.__version__, 'mpi4py': mpi4py.__version__,"
             " 'mpich_wheel': v('mpich'),"
             " 'mpi_library': ' '.join(MPI.Get_library_version().split()[:3])}))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=120, env=env).stdout.strip().splitlines()
        versions = json.loads(out[-1]) if out else {}
    except Exception as exc:  # noqa: BLE001
        versions = {"error": str(exc)}
    try:
        import matplotlib
        versions["matplotlib"] = matplotlib.__version__
    except ImportError:
        versions["matplotlib"] = None
    mem = sh("awk '/MemTotal/ {printf \"%.1f GiB\", $2/1048576}' /proc/meminfo")
    lib = None
    try:
        import glob
        sos = glob.glob(os.path.join(ROOT, "tfring", "_tfring_ops*.so"))
        override = os.environ.get("TFRING_LIBRARY")
        lib_path = override or (sos[0] if sos else None)
        if lib_path and os.path.exists(lib_path):
            mtime = os.path.getmtime(lib_path)
            newer = []
            for d, _, files in os.walk(os.path.join(ROOT, "tf_ops")):
                for f in files:
                    if f.endswith((".cc", ".h")) and os.path.getmtime(os.path.join(d, f)) > mtime:
                        newer.append(os.path.relpath(os.path.join(d, f), ROOT))
            lib = {"path": os.path.relpath(lib_path, ROOT) if lib_path.startswith(ROOT)
                   else lib_path,
                   "built": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(mtime)),
                   "sources_newer_than_library": sorted(newer)}
    except OSError:
        pass
    return {
        "date": started, "finished": finished, "quick": quick,
        "nproc": sh("nproc"), "cpu_model": sh("lscpu | sed -n 's/^Model name: *//p'"),
        "memory": mem, "kernel": platform.release(), "python": platform.python_version(),
        "loadavg_start": None, "loadavg_end": sh("cat /proc/loadavg"),
        "git_head": sh(f"git -C {shlex.quote(ROOT)} log -1 --format='%h %s'"),
        "git_dirty": sh(f"git -C {shlex.quote(ROOT)} status --porcelain -- tf_ops tfring "
                        "| wc -l"),
        "library": lib, **versions,
    }


def main(argv=None):
    args = parse_args(argv)
    r = Runner(args)
    t_start = time.monotonic()
    if not args.report_only:
        parts = PARTS if not args.only else [p.strip() for p in args.only.split(",")]
        for p in parts:
            if p not in PARTS:
                sys.exit(f"unknown part {p!r}; choose from {PARTS}")
        if not args.only and os.path.exists(r.commands):
            os.remove(r.commands)
        started = bc.now_iso()
        load_start = sh("cat /proc/loadavg")
        print(f"tfring benchmarks ({'quick smoke run' if args.quick else 'full run'}); "
              f"load average {load_start}; results in {os.path.relpath(r.results)}", flush=True)
        nps = [int(x) for x in args.nps.split(",")]
        planes = [x.strip() for x in args.planes.split(",")]
        for p in parts:
            if p == "idle":
                run_idle(r, args.quick)
            elif p == "small":
                run_small(r, args.quick)
            elif p == "collectives":
                run_collectives(r, args.quick, nps, planes, args.max_bytes)
            elif p == "independent":
                run_independent(r, args.quick, nps)
            elif p == "training":
                run_training(r, args.quick, args.training_seconds, args.training_reps)
            elif p == "profile":
                run_profile(r, args.quick, args.training_seconds)
        info = machine_info(args.quick, started, bc.now_iso())
        info["loadavg_start"] = load_start
        info["parts"] = list(parts)
        info["run_all_args"] = argv if argv is not None else sys.argv[1:]
        with open(os.path.join(r.results, "machine.json"), "w") as f:
            json.dump(info, f, indent=1, sort_keys=True)
    rc = subprocess.run([sys.executable, os.path.join(HERE, "report.py"), "--results-dir",
                         r.results, "--out", args.report], cwd=ROOT).returncode
    print(f"\nDone in {time.monotonic() - t_start:.0f} s.", flush=True)
    if r.failures:
        print("Failed launches: " + ", ".join(r.failures), flush=True)
    sys.exit(1 if r.failures or rc else 0)


if __name__ == "__main__":
    main()
