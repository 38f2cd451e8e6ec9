"""The allreduce scale model of docs/scaling.md: predicted times of tfring's
allreduce algorithms (ring, recursive doubling, Rabenseifner: the ring
plane's three, tf_ops/common/ops/allreduce_algorithms.h) and of the
hierarchical plane at 8..1024 ranks, from per-hop costs; which one
TFRING_ALLREDUCE_ALGORITHM=auto takes; and the check of the model against
measured runs.

    python benchmarks/scale_model.py [--alpha-us 30] [--fixed-us 250] [--efficiency 0.98]
                                     [--gamma-gbyte 10] [--ranks-per-host 8] [--cpu-gbit 0]
                                     [--check FILE.json] [--check-algorithms FILE.json ...]

Costs (the alpha-beta model, Hockney 1994; per algorithm as in Thakur,
Rabenseifner and Gropp 2005, and as tfring's own chooser models them,
PredictAllreduceSeconds in allreduce_algorithms.cc):
  alpha  seconds per hop: one message handed from a rank to the next and
         the receiver woken (software + wire; --alpha-us);
  beta   seconds per byte on a link: 1 / (rate * efficiency), the
         efficiency being what a raw TCP stream reaches (--efficiency);
         where one core cannot feed the link, 1 / --cpu-gbit instead;
  gamma  seconds per byte reduced (1 / --gamma-gbyte GB/s);
  fixed  seconds per collective whatever the algorithm: the negotiation
         round of tfring's controller and the call itself (--fixed-us).
With p ranks, n bytes, q the largest power of two <= p, l = log2 q,
L ranks per host and H = p / L hosts:
  ring          fixed + 2(p-1) alpha + (p-1)/p n (max(beta, gamma) + beta)
                (each piece's reduction overlaps the next one's transfer)
  rec. doubling fixed + l (alpha + n beta + n gamma) + fold
  Rabenseifner  fixed + 2 l alpha + (q-1)/q n (2 beta + gamma) + fold
  fold          (p not a power of two) 2 (alpha + n beta) + n gamma
  auto          the least of those three (TFRING_ALLREDUCE_ALGORITHM=auto)
  hierarchical  fixed + intra-host stages + auto's algorithm over H hosts
                (intra-host: a reduce-scatter and an allgather in shared
                memory, 2 (L-1) alpha_shm + 2 n / memory bandwidth; the L
                lanes share the host's link, so it moves what one rank of a
                flat allreduce over H ranks would: 2(H-1)/H n for the ring)
--check FILE.json compares the ring prediction with a cross_host.py run's
median times (one rank per host, TF op under --tcp) and prints the ratio.
--check-algorithms FILE.json ... compares each forced algorithm (cross_host.py
--libs tcp-ring,tcp-rd,tcp-rab) with its prediction, alpha and beta taken
from the cell's own raw measurements (a 4 KB one-way hop, a raw stream), and
the model's choice with the fastest measured algorithm.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import human_time as fmt  # noqa: E402

LINKS_GBIT = (10, 25, 100)
RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)
SIZES = {"4 KB": 4 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20}
MEMORY_BYTES_PER_S = 10e9  # one core's memcpy-and-add within a host, conservative
ALPHA_SHM_S = 5e-6
ALGORITHMS = ("ring", "recursive doubling", "Rabenseifner")


def beta(link_gbit, efficiency, cpu_gbit):
    rate = link_gbit * 1e9 / 8 * efficiency
    if cpu_gbit:
        rate = min(rate, cpu_gbit * 1e9 / 8)
    return 1.0 / rate


def _pow2(p):
    q = 1
    while q * 2 <= p:
        q *= 2
    return q


def _fold(p, n, a, b, g):
    return 0.0 if p == _pow2(p) else 2 * (a + n * b) + n * g


def ring(p, n, a, b, fixed, g=0.0):
    return fixed + 2 * (p - 1) * a + (p - 1) / p * n * (max(b, g) + b)


def recursive_doubling(p, n, a, b, fixed, g=0.0):
    return fixed + math.log2(_pow2(p)) * (a + n * b + n * g) + _fold(p, n, a, b, g)


def rabenseifner(p, n, a, b, fixed, g=0.0):
    q = _pow2(p)
    return fixed + 2 * math.log2(q) * a + (q - 1) / q * n * (2 * b + g) + _fold(p, n, a, b, g)


def predict(p, n, a, b, fixed, g):
    """{algorithm: seconds} for the ring plane's three algorithms."""
    return {name: fn(p, n, a, b, fixed, g) for name, fn in
            zip(ALGORITHMS, (ring, recursive_doubling, rabenseifner))}


def choose(p, n, a, b, g):
    """What auto takes: the fastest predicted, the ring on a tie (as
    ChooseAllreduceAlgorithm)."""
    times = predict(p, n, a, b, 0.0, g)
    best = "ring"
    for name in ALGORITHMS[1:]:
        if times[name] < times[best]:
            best = name
    return best


def hierarchical(p, n, a, b, fixed, per_host, g=0.0):
    """The hierarchical plane: shared memory within each host, then its
    cross-host stage, which runs auto's choice among the hosts (its L lanes
    share the host's link, so the link moves what one rank of a flat
    allreduce over H ranks would, and each lane reduces 1/L of it)."""
    hosts = max(1, p // per_host)
    local = 2 * (per_host - 1) * ALPHA_SHM_S + 2 * n / MEMORY_BYTES_PER_S if per_host > 1 else 0
    return fixed + local + min(predict(hosts, n, a, b, 0.0, g / per_host).values())


def tables(args):
    a, fixed, g = args.alpha_us * 1e-6, args.fixed_us * 1e-6, 1.0 / (args.gamma_gbyte * 1e9)
    out = []
    for link in LINKS_GBIT:
        b = beta(link, args.efficiency, args.cpu_gbit)
        out.append(f"\n#### {link} GbE (alpha {args.alpha_us:g} us, fixed {args.fixed_us:g} us, "
                   f"gamma {args.gamma_gbyte:g} GB/s, {args.ranks_per_host} ranks per host for "
                   "hierarchical)\n")
        out.append("| ranks | " + " | ".join(f"{s}: ring / rec. doubling / Rabenseifner / hier."
                                              for s in SIZES) + " |")
        out.append("|---|" + "---|" * len(SIZES))
        for p in RANKS:
            cells = []
            for n in SIZES.values():
                flat = predict(p, n, a, b, fixed, g)
                # Hierarchical needs two hosts at least: "-" below that.
                hier = (hierarchical(p, n, a, b, fixed, args.ranks_per_host, g)
                        if p >= 2 * args.ranks_per_host else None)
                times = [flat[name] for name in ALGORITHMS] + [hier]
                best = min(t for t in times if t is not None)
                cells.append(" / ".join("-" if t is None else f"**{fmt(t)}**" if t == best
                                        else fmt(t) for t in times))
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        out.append("\nauto's choice among the flat three, by size (smallest size for each): "
                   + "; ".join(f"{p} ranks: " + switch_points(p, a, b, g) for p in (8, 64, 1024)))
    return "\n".join(out)


def switch_points(p, a, b, g):
    """Where auto's choice changes at p ranks, between 1 KB and 1 GB."""
    seen, n, parts = None, 1 << 10, []
    while n <= 1 << 30:
        pick = choose(p, n, a, b, g)
        if pick != seen:
            parts.append(f"{pick} from {fmt_bytes(n)}")
            seen = pick
        n = int(n * 1.25) + 1
    return ", ".join(parts)


def fmt_bytes(n):
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def check(args):
    """Ring prediction against a cross_host.py JSON (one rank per host)."""
    with open(args.check) as f:
        cells = json.load(f)["cells"]
    a, fixed = args.alpha_us * 1e-6, args.fixed_us * 1e-6
    rows = ["| link | hosts | size | measured (tfring --tcp) | ring model | model / measured |",
            "|---|---|---|---|---|---|"]
    for cell in cells:
        rate = {"1gbit": 1.0, "2500mbit": 2.5, "5gbit": 5.0}.get(cell["rate"])
        runs = cell["runs"].get("tcp") or []
        if rate is None or not runs or not cell["layout"].endswith("x1"):
            continue
        b = 1.0 / cell["raw_stream_Bps"]
        for label, n in SIZES.items():
            measured = sorted(r["rows"][label] for r in runs)[len(runs) // 2]
            model = ring(cell["np"], n, a, b, fixed)
            rows.append(f"| {rate:g} Gbit/s | {cell['np']} | {label} | {fmt(measured)} | "
                        f"{fmt(model)} | {model / measured:.2f} |")
    return "\n".join(rows)


def check_algorithms(args):
    """Each forced algorithm (cross_host.py --libs tcp-ring,tcp-rd,tcp-rab)
    against the model, per cell of one or more runs; alpha and beta from
    the cell's raw 4 KB hop and stream, fixed and gamma as given."""
    fixed, g = args.fixed_us * 1e-6, 1.0 / (args.gamma_gbyte * 1e9)
    libs = {"tcp-ring": "ring", "tcp-rd": "recursive doubling", "tcp-rab": "Rabenseifner"}
    rows = ["| run | link, hosts | size | " + " | ".join(
                f"{name}: measured / model (model ÷ measured)" for name in ALGORITHMS)
            + " | fastest measured | model's pick (measured / fastest) |",
            "|---|---|---|" + "---|" * len(ALGORITHMS) + "---|---|"]
    for k, path in enumerate(args.check_algorithms, 1):
        with open(path) as f:
            cells = json.load(f)["cells"]
        for cell in cells:
            runs = {libs[lib]: r for lib, r in cell["runs"].items() if lib in libs and r}
            if len(runs) < len(ALGORITHMS) or not cell["layout"].endswith("x1"):
                continue
            b = 1.0 / cell["raw_stream_Bps"]
            a = cell["raw_4k_one_way_s"]
            for label, n in SIZES_CHECKED.items():
                measured = {name: _median([r["rows"][label] for r in runs[name]
                                           if label in r["rows"]]) for name in ALGORITHMS}
                if any(m is None for m in measured.values()):
                    continue
                model = predict(cell["np"], n, a, b, fixed, g)
                fastest = min(measured, key=measured.get)
                pick = choose(cell["np"], n, a, b, g)
                rows.append(
                    f"| {k} | {cell['rate']}, {cell['np']} | {label} | " + " | ".join(
                        f"{fmt(measured[name])} / {fmt(model[name])} "
                        f"({model[name] / measured[name]:.2f})" for name in ALGORITHMS)
                    + f" | {fastest} | {pick} ({measured[pick] / measured[fastest]:.2f}) |")
    return "\n".join(rows)


SIZES_CHECKED = {"4 KB": 4 << 10, "64 KB": 64 << 10, "1 MB": 1 << 20, "16 MB": 16 << 20,
                 "64 MB": 64 << 20}


def _median(values):
    return sorted(values)[len(values) // 2] if values else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--alpha-us", type=float, default=30.0)
    p.add_argument("--fixed-us", type=float, default=250.0)
    p.add_argument("--efficiency", type=float, default=0.98)
    p.add_argument("--gamma-gbyte", type=float, default=MEMORY_BYTES_PER_S / 1e9,
                   help="GB/s one core reduces (gamma = 1 / this)")
    p.add_argument("--ranks-per-host", type=int, default=8)
    p.add_argument("--cpu-gbit", type=float, default=0.0,
                   help="the rate one rank's core can feed (0: the link binds)")
    p.add_argument("--check", help="a cross_host.py --json file")
    p.add_argument("--check-algorithms", nargs="+",
                   help="cross_host.py --json files with tcp-ring, tcp-rd and tcp-rab runs")
    args = p.parse_args()
    if args.check_algorithms:
        print(check_algorithms(args))
    else:
        print(check(args) if args.check else tables(args))


if __name__ == "__main__":
    main()
