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


def summary(report):
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
    lines.append("memory (RSS) per worker: first sample after start-up, last, growth, "
                 "seconds between them")
    for wid, samples in sorted(report["memory_kb"].items(), key=lambda kv: int(kv[0])):
        if len(samples) < 3:
            continue
        (t1, first), (t2, last) = samples[1], samples[-1]
        lines.append(f"  worker {wid}: {first / 1024:.1f} MB -> {last / 1024:.1f} MB "
                     f"({(last - first) / 1024:+.2f} MB over {t2 - t1:.0f} s, "
                     f"{len(samples)} samples)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--step-sleep", type=float, default=0.25,
                        help="seconds each worker sleeps between steps (CPU it takes)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfring-chaos-") as workdir:
        run = chaos.ChaosRun(workdir, seed=args.seed, hosts=args.hosts, bound=180.0,
                             step_sleep=args.step_sleep,
                             log=lambda line: print(time.strftime("%H:%M:%S"), line, flush=True))
        report = run.run(duration=args.duration)
    report["load_average_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(summary(report))


if __name__ == "__main__":
    main()
