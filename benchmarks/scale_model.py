"""The allreduce scale model of docs/scaling.md: predicted times of ring,
hierarchical and tree allreduce at 8..1024 ranks, from per-hop costs.

    python benchmarks/scale_model.py [--alpha-us 40] [--fixed-us 250] [--efficiency 0.98]
                                     [--ranks-per-host 8] [--cpu-gbit 0] [--check FILE.json]

Costs (the alpha-beta model, Hockney 1994; per algorithm as in Thakur,
Rabenseifner and Gropp 2005):
  alpha  seconds per hop: one message handed from a rank to the next and
         the receiver woken (software + wire; --alpha-us);
  beta   seconds per byte on a link: 1 / (rate * efficiency), the
         efficiency being what a raw TCP stream reaches (--efficiency);
         where one core cannot feed the link, 1 / --cpu-gbit instead;
  fixed  seconds per collective whatever the algorithm: the negotiation
         round of tfring's controller and the call itself (--fixed-us).
With p ranks, n bytes, L ranks per host and H = p / L hosts:
  ring          fixed + 2(p-1) alpha + 2(p-1)/p n beta
  hierarchical  fixed + 2(H-1) alpha + 2(H-1)/H n beta + intra-host stages
                (a reduce-scatter and an allgather in shared memory:
                2 (L-1) alpha_shm + 2 n / memory bandwidth; L lanes share
                the host's link, so the link moves 2(H-1)/H n per host)
  tree          fixed + 2 ceil(log2 p) (alpha + n beta)  (binomial reduce
                then broadcast, unpipelined)
  rabenseifner  fixed + 2 ceil(log2 p) alpha + 2(p-1)/p n beta  (recursive
                halving then doubling; for contrast)
--check FILE.json compares the ring prediction with a cross_host.py run's
median times (one rank per host) and prints the ratio.
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


def beta(link_gbit, efficiency, cpu_gbit):
    rate = link_gbit * 1e9 / 8 * efficiency
    if cpu_gbit:
        rate = min(rate, cpu_gbit * 1e9 / 8)
    return 1.0 / rate


def ring(p, n, a, b, fixed):
    return fixed + 2 * (p - 1) * a + 2 * (p - 1) / p * n * b


def hierarchical(p, n, a, b, fixed, per_host):
    hosts = max(1, p // per_host)
    local = 2 * (per_host - 1) * ALPHA_SHM_S + 2 * n / MEMORY_BYTES_PER_S if per_host > 1 else 0
    return fixed + local + 2 * (hosts - 1) * a + 2 * (hosts - 1) / hosts * n * b


def tree(p, n, a, b, fixed):
    return fixed + 2 * math.ceil(math.log2(p)) * (a + n * b)


def rabenseifner(p, n, a, b, fixed):
    return fixed + 2 * math.ceil(math.log2(p)) * a + 2 * (p - 1) / p * n * b


def tables(args):
    a, fixed = args.alpha_us * 1e-6, args.fixed_us * 1e-6
    out = []
    for link in LINKS_GBIT:
        b = beta(link, args.efficiency, args.cpu_gbit)
        out.append(f"\n#### {link} GbE (alpha {args.alpha_us:g} us, fixed {args.fixed_us:g} us, "
                   f"{args.ranks_per_host} ranks per host for hierarchical)\n")
        out.append("| ranks | " + " | ".join(f"{s}: ring / hier. / tree" for s in SIZES) + " |")
        out.append("|---|" + "---|" * len(SIZES))
        for p in RANKS:
            cells = []
            for n in SIZES.values():
                # Hierarchical needs two hosts at least: "-" below that.
                hier = (hierarchical(p, n, a, b, fixed, args.ranks_per_host)
                        if p >= 2 * args.ranks_per_host else None)
                times = (ring(p, n, a, b, fixed), hier, tree(p, n, a, b, fixed))
                best = min(t for t in times if t is not None)
                cells.append(" / ".join("-" if t is None else f"**{fmt(t)}**" if t == best
                                        else fmt(t) for t in times))
            out.append(f"| {p} | " + " | ".join(cells) + " |")
        out.append("\nRing and tree cross over (tree faster below) at about: " + ", ".join(
            f"{p} ranks: {fmt_bytes(crossover(p, a, b))}" for p in (8, 64, 1024)))
    return "\n".join(out)


def crossover(p, a, b):
    """Bytes below which the tree beats the flat ring at p ranks."""
    lg = 2 * math.ceil(math.log2(p))
    # fixed cancels: 2(p-1)a + 2(p-1)/p n b = lg a + lg n b
    denominator = (lg - 2 * (p - 1) / p) * b
    return max(0.0, (2 * (p - 1) - lg) * a / denominator)


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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--alpha-us", type=float, default=40.0)
    p.add_argument("--fixed-us", type=float, default=250.0)
    p.add_argument("--efficiency", type=float, default=0.98)
    p.add_argument("--ranks-per-host", type=int, default=8)
    p.add_argument("--cpu-gbit", type=float, default=0.0,
                   help="the rate one rank's core can feed (0: the link binds)")
    p.add_argument("--check", help="a cross_host.py --json file")
    args = p.parse_args()
    print(check(args) if args.check else tables(args))


if __name__ == "__main__":
    main()
