"""Per-step breakdown of a training run from tfring's timeline.

Usage::

    TFRING_TIMELINE=/tmp/tl.json tfringrun -np 2 python benchmarks/training.py --seconds 10
    python benchmarks/step_timeline.py /tmp/tl.json [--out results/profile.jsonl]

A step is the time between the first negotiation start of one training step
and the next (the gradient allreduces of a step are the timeline's rows; a
step starts when the first of them is submitted). For the steps after
``--skip`` warm-up steps it reports medians of: the step; the communication
span (first submission to the last data-plane call's end: communication
that overlaps the backward pass counts here); the wait from the first
submission to the first data-plane call (negotiation, including waiting for
the other ranks to submit); the data-plane time (which includes a plane's
wait for a peer that arrives later); the fusion-buffer copies; and the
number of responses (negotiated batches) per step.
"""
import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # noqa: E402


def read_events(path):
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip().rstrip(",")
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass  # a line cut short when the job ended
    return events


def breakdown(events, skip):
    starts_by_row = defaultdict(list)
    for e in events:
        if e.get("ph") == "B" and e.get("name", "").startswith("NEGOTIATE_ALLREDUCE"):
            starts_by_row[e["pid"]].append(e["ts"])
    if not starts_by_row:
        return None
    steps = max(len(v) for v in starts_by_row.values())
    starts = [min(v[i] for v in starts_by_row.values() if len(v) > i) for i in range(steps)]
    spans = sorted({(e["ts"], e["dur"], e["name"]) for e in events
                    if e.get("ph") == "X" and "BROADCAST" not in e["name"]})
    rows = []
    for i in range(skip, steps - 1):
        a, b = starts[i], starts[i + 1]
        inside = [t for t in spans if a <= t[0] < b]
        planes = [t for t in inside if t[2].endswith("_ALLREDUCE")]
        if not planes:
            continue
        rows.append({
            "step_ms": (b - a) / 1e3,
            "comm_span_ms": (max(t[0] + t[1] for t in inside) - a) / 1e3,
            "first_wait_ms": (min(t[0] for t in planes) - a) / 1e3,
            "data_plane_ms": sum(t[1] for t in planes) / 1e3,
            "copies_ms": sum(t[1] for t in inside if "MEMCPY" in t[2]) / 1e3,
            "responses": len(planes),
        })
    if not rows:
        return None
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]} | {"steps": len(rows)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("timeline")
    p.add_argument("--skip", type=int, default=20, help="warm-up steps left out")
    p.add_argument("--out", help="append the result as a JSON line")
    p.add_argument("--label", default="timeline")
    args = p.parse_args(argv)
    b = breakdown(read_events(args.timeline), args.skip)
    if b is None:
        sys.exit(f"{args.timeline}: no allreduce steps found")
    for k, v in b.items():
        print(f"{k:>15}: {v:.3f}" if isinstance(v, float) else f"{k:>15}: {v}")
    bc.append_jsonl(args.out, [{"bench": "timeline", "label": args.label, "time": bc.now_iso(),
                                **b}])


if __name__ == "__main__":
    main()
