"""What reducing in rank order costs the shared-memory data plane: the plane
built from a base revision's sources (default ``main``) against the plane in
this tree, in one run, launches alternating.

Both binaries are the C++ shm bench (``tf_ops/common/tests/bench/shm_bench.cc``:
forked ranks, no TF, no MPI) from this tree, compiled once with
the base's ``tf_ops/common`` and once with this tree's, with the op
library's optimisation flags. The rounds alternate which plane runs first;
every launch records the load average before it. Per collective, size and
np the table gives the median over rounds of each launch's median time and
of rank 0's CPU time, and the median and range over rounds of the ratio
new/base within a round (the two launches of a round run back to back, so
the ratio sees the least drift in the machine's load)::

    python benchmarks/shm_rank_order.py [--base main] [--np 2 --np 3]
        [--sizes 64K,256K,1M,4M,16M,64M] [--rounds 3]
        [--collectives allreduce,allreduce-inplace,reducescatter]
        [--out benchmarks/results/shm_rank_order]

``--out`` gets ``results.json`` (every launch's lines, load and command) and
``results.log`` (the printed table).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tfring.build.unit_tests import UNIT_TEST_SOURCES  # noqa: E402

BENCH = "bench/shm_bench.cc"
# The bench's own file and the test headers it includes, taken from this tree.
BENCH_FILES = [BENCH, "shm_job.h", "check.h"]
FLAGS = ["g++", "-std=c++17", "-O2", "-DNDEBUG", "-fvect-cost-model=cheap", "-pthread"]
LINE = re.compile(r"np=(\d+) (\S+)\s+(\d+) bytes: median\s+([\d.]+) us \(min\s+([\d.]+)\)"
                  r".*rank-0 CPU\s+([\d.]+) us")


def parse_size(text):
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def human(nbytes):
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def build(common_dir, binary):
    """The bench from this tree's bench/shm_bench.cc over the core in
    `common_dir` (the files this tree's unit_tests.UNIT_TEST_SOURCES lists)."""
    tests = os.path.join(common_dir, "tests")
    for name in BENCH_FILES:
        src = os.path.join(ROOT, "tf_ops", "common", "tests", *name.split("/"))
        dst = os.path.join(tests, *name.split("/"))
        if os.path.abspath(src) != os.path.abspath(dst):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(src) as f, open(dst, "w") as g:
                g.write(f.read())
    cmd = FLAGS + ["-o", binary, os.path.join(tests, *BENCH.split("/"))] + [
        os.path.join(common_dir, *s.split("/")) for s in UNIT_TEST_SOURCES[BENCH]]
    subprocess.run(cmd, check=True, timeout=900)
    return cmd


def export_base(base, into):
    """tf_ops/common as of git revision `base`, under `into`."""
    os.makedirs(into, exist_ok=True)
    archive = subprocess.run(["git", "-C", ROOT, "archive", base, "tf_ops/common"],
                             check=True, capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True, timeout=120)
    return os.path.join(into, "tf_ops", "common")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="main")
    ap.add_argument("--np", type=int, action="append", dest="nps")
    ap.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--collectives", default="allreduce,allreduce-inplace,reducescatter")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    nps = args.nps or [2, 3]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    collectives = args.collectives.split(",")
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    base_rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", args.base],
                              capture_output=True, text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="tfring-shm-order-")
    binaries = {f"base ({args.base} {base_rev})": os.path.join(work, "shm_bench_base"),
                f"this tree ({head}+worktree)": os.path.join(work, "shm_bench_new")}
    labels = list(binaries)
    build(export_base(args.base, os.path.join(work, "base")), binaries[labels[0]])
    build(os.path.join(ROOT, "tf_ops", "common"), binaries[labels[1]])

    launches = []
    for rnd in range(args.rounds):
        for np_ in nps:
            for coll in collectives:
                order = labels if rnd % 2 == 0 else labels[::-1]
                for label in order:
                    cmd = [binaries[label], "--np", str(np_), "--collective", coll,
                           "--timeout", "600"]
                    for b in sizes:
                        cmd += ["--bytes", str(b)]
                    load = os.getloadavg()
                    t0 = time.monotonic()
                    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                    if run.returncode != 0:
                        sys.exit(f"{label} failed:\n{run.stdout}\n{run.stderr}")
                    rows = [dict(zip(("np", "collective", "bytes", "median_us", "min_us",
                                      "cpu_us"), (int(m[1]), m[2], int(m[3]), float(m[4]),
                                                  float(m[5]), float(m[6]))))
                            for m in LINE.finditer(run.stdout)]
                    launches.append({"round": rnd, "plane": label, "np": np_, "collective": coll,
                                     "loadavg_before": load, "loadavg_after": os.getloadavg(),
                                     "wall_s": round(time.monotonic() - t0, 2),
                                     "command": " ".join(os.path.basename(c) if i == 0 else c
                                                         for i, c in enumerate(cmd)),
                                     "rows": rows})
                    print(f"round {rnd} np={np_} {coll} {label}: load {load[0]:.2f}",
                          file=sys.stderr, flush=True)

    lines = [f"shm plane, rank-order reduction ({labels[1]}) against {labels[0]}; "
             f"{args.rounds} alternating rounds, median of the launches' medians (us); "
             f"nproc {os.cpu_count()}",
             f"{'np':>3} {'collective':<18} {'size':>6} {'base us':>10} {'new us':>10} "
             f"{'new/base (range)':>18}  {'base CPU':>9} {'new CPU':>9} {'CPU new/base':>12}"]
    for np_ in nps:
        for coll in collectives:
            for b in sizes:
                per_round = {}  # round -> {label: row}
                for x in launches:
                    if x["np"] == np_ and x["collective"] == coll:
                        for r in x["rows"]:
                            if r["bytes"] == b:
                                per_round.setdefault(x["round"], {})[x["plane"]] = r
                rounds = list(per_round.values())
                med = {lb: statistics.median(r[lb]["median_us"] for r in rounds) for lb in labels}
                cpu = {lb: statistics.median(r[lb]["cpu_us"] for r in rounds) for lb in labels}
                ratios = [r[labels[1]]["median_us"] / r[labels[0]]["median_us"] for r in rounds]
                cpu_ratio = statistics.median(r[labels[1]]["cpu_us"] / r[labels[0]]["cpu_us"]
                                              for r in rounds)
                spread = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
                lines.append(f"{np_:>3} {coll:<18} {human(b):>6} {med[labels[0]]:>10.1f} "
                             f"{med[labels[1]]:>10.1f} {spread:>18}  {cpu[labels[0]]:>9.1f} "
                             f"{cpu[labels[1]]:>9.1f} {cpu_ratio:>12.2f}")
    loads = [x["loadavg_before"][0] for x in launches]
    lines.append(f"load average (1 min) before each launch: min {min(loads):.2f}, "
                 f"median {statistics.median(loads):.2f}, max {max(loads):.2f}")
    print("\n".join(lines))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"argv": sys.argv, "base": f"{args.base} {base_rev}", "head": head,
                       "compile": FLAGS, "nproc": os.cpu_count(), "launches": launches}, f,
                      indent=1)
        with open(os.path.join(args.out, "results.log"), "w") as f:
            f.write("$ python " + " ".join(sys.argv) + "\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
