"""run_all.py's parts for two builds of tfring, interleaved in one run, and a
table of their headline figures side by side: did a change make anything
slower?

Usage (from the repository root)::

    python benchmarks/before_after.py --before /path/to/old/checkout \\
        --after . --rounds 2 --out benchmarks/results/before_after_s11

Each checkout must hold its own built library (``python setup.py build_ext
--inplace`` in it). Each part runs from its own checkout (its ``run_all.py``,
its ``tfring``), alternating which build goes first from round to round, so
that a load that drifts during the run weighs on both alike. Every launch
keeps run_all.py's own timeouts. A part whose results are there already
is kept, so a run can be extended by more rounds. Writes ``OUT/<label>-<round>/`` (run_all's
results and report for that part) and ``OUT/README.md`` (the table, the
command and the machine's load before and after).
"""
import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time

PARTS = ("idle", "small", "collectives", "independent", "training")
# run_all.py's part name -> the JSON-lines file it writes.
FILES = {"idle": "idle.jsonl", "small": "small_tensors.jsonl",
         "collectives": "collectives.jsonl", "independent": "independent.jsonl",
         "training": "training.jsonl"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="checkout of the old build")
    p.add_argument("--after", default=".", help="checkout of the new build")
    p.add_argument("--parts", default=",".join(PARTS), help="run_all.py parts, comma-separated")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", required=True, help="results folder")
    p.add_argument("--quick", action="store_true", help="run_all.py --quick (smoke run)")
    p.add_argument("--run-all-args", default="",
                   help="more run_all.py options for every part, e.g. \"--nps 2 --max-bytes 16M\"")
    p.add_argument("--table-only", action="store_true", help="only rebuild the table from OUT")
    return p.parse_args(argv)


def load():
    return os.getloadavg()[0]


def run_part(checkout, part, results, quick, extra=()):
    """One run_all.py part from `checkout`; returns its exit code."""
    checkout = os.path.abspath(checkout)
    env = dict(os.environ, PYTHONPATH=checkout)
    env.pop("TFRING_LIBRARY", None)  # each checkout's own library
    cmd = [sys.executable, os.path.join(checkout, "benchmarks", "run_all.py"), "--only", part,
           "--results-dir", results, "--report", os.path.join(results, "RESULTS.md")]
    if quick:
        cmd.append("--quick")
    cmd += list(extra)
    print(f"before_after: {shlex.join(cmd)}  (load {load():.1f})", flush=True)
    return subprocess.run(cmd, cwd=checkout, env=env, timeout=3600).returncode


def _records(folder, part):
    path = os.path.join(folder, FILES[part])
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _median(d):
    return d.get("median") if isinstance(d, dict) else None


def figures(folder):
    """{(part, what): (value, unit, higher_is_better)} from one run's results."""
    out = {}
    for r in _records(folder, "idle"):
        if r.get("rank") == 0:
            out["idle", f"CPU while idle, np={r['np']}"] = (r["idle"]["cpu_per_s"] * 1e3,
                                                           "ms CPU/s", False)
    for r in _records(folder, "small"):
        tag = f"np={r['np']} {r['label']}"
        out["small", f"200 x 4 KB step, {tag}"] = (_median(r["step200"]) * 1e3, "ms", False)
        chain = (r.get("chain_per_op") or {}).get("chain")
        if _median(chain):
            out["small", f"chained allreduce per op, {tag}"] = (_median(chain) * 1e6, "us", False)
        for name in ("eager_allreduce", "function_allreduce"):
            value = _median((r.get("latency") or {}).get(name))
            if value:
                out["small", f"{name.replace('_', ' ')} 4 KB, {tag}"] = (value * 1e6, "us", False)
    for r in _records(folder, "collectives"):
        what = (f"{r['collective']} {r['nominal_bytes'] // 1024} KB np={r['np']} "
                f"{r['label']}")
        out["collectives", what] = (r["tfring_busbw"], "GB/s busbw", True)
    for r in _records(folder, "independent"):
        out["independent", f"{r['bytes'] // 1024} KB np={r['np']}"] = (
            _median(r["tfring"]) * 1e6, "us", False)
    by_label = {}
    for r in _records(folder, "training"):
        by_label.setdefault(r["label"], []).append(r["images_per_sec"])
    for label, values in by_label.items():
        out["training", f"images/s, {label}"] = (statistics.median(values), "images/s", True)
    return out


def table(out_dir, rounds):
    runs = {label: [figures(os.path.join(out_dir, f"{label}-{r}")) for r in range(1, rounds + 1)]
            for label in ("before", "after")}
    keys = sorted({k for label in runs for run in runs[label] for k in run})
    lines = ["| part | figure | before | after | after / before |", "|---|---|---:|---:|---:|"]
    worse, slowdowns = [], {}
    for key in keys:
        values = {label: [run[key][0] for run in runs[label] if key in run] for label in runs}
        if not values["before"] or not values["after"]:
            continue
        unit, higher = next(run[key][1:] for label in runs for run in runs[label] if key in run)
        b, a = statistics.median(values["before"]), statistics.median(values["after"])
        ratio = a / b if b else float("nan")
        # "Slower" by more than the spread between the rounds of one build.
        spread = max((max(v) - min(v)) / statistics.median(v) if statistics.median(v) else 0
                     for v in values.values())
        slower = (ratio < 1 - spread) if higher else (ratio > 1 + spread)
        if slower:
            worse.append(key)
        if ratio > 0:
            slowdowns[key] = 1 / ratio if higher else ratio
        lines.append(f"| {key[0]} | {key[1]} | {b:.4g} {unit} | {a:.4g} {unit} | "
                     f"{ratio:.2f}{' **slower**' if slower else ''} |")
    summary = ["", "| part | figures | geometric mean of after / before (higher-is-better "
               "figures inverted: above 1 is slower) |", "|---|---:|---:|"]
    for part in sorted({k[0] for k in slowdowns}):
        logs = [math.log(x) for k, x in slowdowns.items() if k[0] == part]
        summary.append(f"| {part} | {len(logs)} | {math.exp(sum(logs) / len(logs)):.3f} |")
    return "\n".join(lines + summary), worse


def main(argv=None):
    args = parse_args(argv)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for p in parts:
        if p not in PARTS:
            sys.exit(f"unknown part {p!r}; choose from {PARTS}")
    started, load_before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    codes = []
    if not args.table_only:
        for r in range(1, args.rounds + 1):
            order = [("before", args.before), ("after", args.after)]
            if r % 2 == 0:
                order.reverse()
            for part in parts:
                for label, checkout in order:
                    results = os.path.join(out_dir, f"{label}-{r}")
                    if os.path.exists(os.path.join(results, FILES[part])):
                        print(f"before_after: {part} of {label}-{r} is there already; kept")
                        continue
                    code = run_part(checkout, part, os.path.join(out_dir, f"{label}-{r}"),
                                    args.quick, shlex.split(args.run_all_args))
                    codes.append((label, r, part, code))
    text, worse = table(out_dir, args.rounds)
    failed = [c for c in codes if c[3] != 0]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(f"# Before and after, interleaved in one run\n\n"
                f"- Command: `python benchmarks/before_after.py {shlex.join(sys.argv[1:])}`\n"
                f"- Started {started}; load average (1, 5, 15 min) before "
                f"{', '.join(f'{x:.1f}' for x in load_before)}, after "
                f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.\n"
                f"- `before`: {os.path.abspath(args.before)}; `after`: "
                f"{os.path.abspath(args.after)}.\n"
                f"- Medians over {args.rounds} rounds; a figure is marked slower when the change "
                "exceeds the spread between the rounds of either build.\n"
                + (f"- Failed launches: {failed}\n" if failed else "") + "\n" + text + "\n")
    print(text)
    print(f"before_after: {len(worse)} figure(s) slower beyond the rounds' spread: {worse}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
