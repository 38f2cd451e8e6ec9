"""Helpers shared by the benchmark scripts (standard library only).

The scripts run as ``python benchmarks/NAME.py`` under tfringrun, so this
module is importable as ``bench_common`` from their own directory.
"""
import json
import os
import resource
import statistics
import time

KB = 1 << 10
MB = 1 << 20

# nccl-tests' bus-bandwidth factors (doc/PERFORMANCE.md there): busbw = algbw * factor(n).
BUSBW_FACTOR = {
    "allreduce": lambda n: 2.0 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}

# Environment variables worth recording with every result: tfring's own
# settings, Horovod spellings of them, and MPICH's run-time knobs.
ENV_PREFIXES = ("TFRING_", "HOROVOD_", "MPIR_CVAR_", "TF_NUM_", "OMP_NUM_THREADS")


def parse_size(text):
    """'4K' -> 4096, '64M' -> 67108864, '123' -> 123."""
    text = text.strip().upper().rstrip("B")
    scale = {"K": KB, "M": MB, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * scale)


def human_size(nbytes):
    for unit, scale in (("G", 1 << 30), ("M", MB), ("K", KB)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    if nbytes >= MB:
        return f"{nbytes / MB:.1f}M"
    if nbytes >= KB:
        return f"{nbytes / KB:.1f}K"
    return f"{nbytes}B"


def human_time(seconds):
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def summary(values):
    """Median and spread of a list of timings (seconds)."""
    values = sorted(values)
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"n": len(values), "median": statistics.median(values), "min": values[0],
            "q1": q[0], "q3": q[2], "max": values[-1], "mean": statistics.fmean(values)}


def recorded_env(env=os.environ):
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def cpu_ticks_from_proc(path="/proc/self/stat"):
    """utime + stime of a process (or thread) in seconds, from /proc/.../stat."""
    with open(path) as f:
        data = f.read()
    # The command name (field 2) is in parentheses and may contain spaces.
    fields = data[data.rindex(")") + 2:].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def thread_cpu():
    """{tid: (name, cpu_seconds)} for every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, cpu_ticks_from_proc(f"/proc/self/task/{tid}/stat"))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def rusage_cpu():
    """Process CPU seconds (user + system) from getrusage, microsecond resolution."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def append_jsonl(path, records):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def configure_tf_threads(intra=None, inter=None):
    """Sets TF's thread pools; must run before TensorFlow executes any op."""
    import tensorflow as tf
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)
