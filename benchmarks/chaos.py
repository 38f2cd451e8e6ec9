"""The long chaos run (issue 40): tests/chaos/chaos.py's seeded faults for
an hour (or --duration seconds) against elastic Keras training on 4 fake
hosts, with the resident memory of every worker sampled after each round.

Writes the whole report as JSON (--out) and prints a summary: the faults
injected by type, the recoveries, the longest ones, the loss's distance from
the replay, and memory per worker over time.

    sudo python benchmarks/chaos.py --duration 3600 --seed 40 \\
        --out benchmarks/results/chaos_hour.json

Needs root and network namespaces (as the fake-host tests do).
"""
import argparse
import collections
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "chaos"))

import chaos  # noqa: E402

# Rounds a worker lives before its memory counts (see memory_summary).
WARMUP_ROUNDS = 3


def _median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0


def memory_summary(memory_kb, warmup_rounds=WARMUP_ROUNDS):
    """Lines on each worker's resident memory (sampled after every round).

    A worker's first rounds each bring something it has not done before (a
    lost peer's error path, a job size it has not run at), which costs once:
    the growth per round by the worker's age shows whether it stops (a leak
    per reset would not; benchmarks/elastic_memory.py measures that alone). Growth
    "after warm-up" runs from the sample after the worker's first
    `warmup_rounds` rounds to its last; the old statistic (from its second
    sample) is kept beside it."""
    lines = ["memory (RSS) per worker, sampled after every round:"]
    by_age = collections.defaultdict(list)
    raw, warm = [], []
    for wid, samples in memory_kb.items():
        for age in range(1, len(samples)):
            by_age[min(age, 10)].append(samples[age][1] - samples[age - 1][1])
        if len(samples) >= 3:
            raw.append(((samples[-1][1] - samples[1][1]) / 1024, wid,
                        samples[-1][0] - samples[1][0]))
        if len(samples) >= warmup_rounds + 2:
            warm.append(((samples[-1][1] - samples[warmup_rounds][1]) / 1024, wid,
                         samples[-1][0] - samples[warmup_rounds][0]))
    lines.append("  growth in a round by the worker's age in rounds (KB): "
                 + ", ".join(f"{age if age < 10 else '10+'}: median {_median(d)} mean "
                             f"{sum(d) / len(d):.0f} (n={len(d)})"
                             for age, d in sorted(by_age.items())))
    for name, rows in (("from its 2nd sample (workers sampled 3+ times)", raw),
                       (f"after warm-up (from the sample after its first {warmup_rounds} "
                        f"rounds)", warm)):
        if not rows:
            continue
        rows.sort()
        worst = ", ".join(f"worker {w}: {g:+.2f} MB over {t:.0f} s" for g, w, t in rows[-3:])
        lines.append(f"  growth {name}: {len(rows)} workers, median "
                     f"{_median(g for g, _, _ in rows):+.2f} MB, max {rows[-1][0]:+.2f} MB "
                     f"(target 1 MB: {'met' if rows[-1][0] <= 1.0 else 'missed'}); largest: "
                     f"{worst}")
    return lines


def step_lines(memory_kb, detail, warmup_rounds=WARMUP_ROUNDS, least_kb=512):
    """With --memory-detail: each step of `least_kb` or more in a worker's
    RSS after its warm-up, with what changed (tests/chaos/memory_detail.py)."""
    lines = []
    for wid, rows in sorted(detail.items(), key=lambda kv: int(kv[0])):
        # rows[i] is the change into the worker's sample i + 1.
        for i, (t, kb, what) in enumerate(rows):
            if i + 1 > warmup_rounds and kb >= least_kb:
                lines.append(f"  worker {wid} at {t:.0f} s: {kb:+d} KB: {json.dumps(what)}")
    if lines:
        lines.insert(0, f"steps of {least_kb} KB or more after warm-up, and what changed:")
    return lines


def summary(report, warmup_rounds=WARMUP_ROUNDS):
    rounds = report["rounds"]
    lines = [f"seed {report['seed']}, {report['hosts']} fake hosts, {len(rounds)} rounds, "
             f"{report['steps']} steps in {report['seconds']:.0f} s, exit code "
             f"{report['exit_code']}, final weights equal: {report['final_weights_equal']}"]
    by_fault = collections.defaultdict(list)
    for r in rounds:
        by_fault[r["fault"]].append(r)
    lines.append("| fault | injected | recovered | degraded: median / max s | whole again: "
                 "median / max s |")
    lines.append("|---|---:|---:|---:|---:|")
    for fault in chaos.FAULTS:
        rs = by_fault.get(fault, [])
        if not rs:
            continue
        whole = sorted(r["whole_s"] for r in rs)
        degraded = sorted(r["degraded_s"] for r in rs if "degraded_s" in r)
        deg = f"{degraded[len(degraded) // 2]:.1f} / {degraded[-1]:.1f}" if degraded else "-"
        lines.append(f"| {fault} | {len(rs)} | {len(rs)} | {deg} | "
                     f"{whole[len(whole) // 2]:.1f} / {whole[-1]:.1f} |")
    longest = max(rounds, key=lambda r: r["whole_s"]) if rounds else None
    if longest:
        lines.append(f"longest recovery: round {longest['round']} ({longest['fault']} on "
                     f"{longest['host']}): {longest['whole_s']} s")
    lines.append(f"largest loss distance from the replay (relative): "
                 f"{max((r['loss_rtol'] for r in rounds), default=0):.2e}")
    lines.extend(memory_summary(report["memory_kb"], warmup_rounds))
    if "memory_detail" in report:
        lines.extend(step_lines(report["memory_kb"], report["memory_detail"], warmup_rounds))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--step-sleep", type=float, default=0.25,
                        help="seconds each worker sleeps between steps (CPU it takes)")
    parser.add_argument("--warmup-rounds", type=int, default=WARMUP_ROUNDS,
                        help="rounds a worker lives before its memory growth counts")
    parser.add_argument("--memory-detail", action="store_true",
                        help="record where each worker's memory is at each sample and "
                             "print what changed in its large steps (costs the workers "
                             "a few ms a step)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="tfring-chaos-") as workdir:
        run = chaos.ChaosRun(workdir, seed=args.seed, hosts=args.hosts, bound=180.0,
                             step_sleep=args.step_sleep, memory_detail=args.memory_detail,
                             log=lambda line: print(time.strftime("%H:%M:%S"), line, flush=True))
        try:
            report = run.run(duration=args.duration)
        except chaos.ChaosFailure as e:
            # What was measured up to the failure is kept (--out), with why it
            # ended; the summary is printed from it and the exit code is 1.
            report = {"seed": args.seed, "hosts": args.hosts, "rounds": run.rounds,
                      "exit_code": None, "steps": run._progress().last_step() + 1,
                      "seconds": round(time.time() - started, 1), "final_weights_equal": None,
                      "memory_kb": run.memory, "failure": str(e)}
            if args.memory_detail:
                report["memory_detail"] = run.detail
    report["load_average_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(summary(report, args.warmup_rounds))
    if "failure" in report:
        print(report["failure"])
        sys.exit(1)


if __name__ == "__main__":
    main()
