"""Draws one training step of a tfring timeline (Chrome-trace JSON) as a PNG.

    python docs/tools/render_timeline.py timeline.json out.png [--step N]

A step is a burst of gradient allreduces: bursts are split where no tensor
is active for more than --gap-ms. Each row is one tensor (a timeline
"process"); bars are its phases: QUEUE (submitted, waiting to be
negotiated), NEGOTIATE_* (ranks agreeing), and the data-plane work
(MEMCPY_IN/OUT_FUSION_BUFFER, SHM_/RING_/MPI_ALLREDUCE, ...). Needs
matplotlib.
"""
import argparse
import json


def spans(events):
    """[(pid, tid, name, start_us, end_us)] from B/E pairs and X events. tid 0
    holds a tensor's states (NEGOTIATE_*, QUEUE), tid 1 the data-plane work."""
    out, open_by_key = [], {}
    for e in events:
        ph, key = e.get("ph"), (e.get("pid"), e.get("tid", 0))
        if ph == "B":
            open_by_key.setdefault(key, []).append(e)
        elif ph == "E" and open_by_key.get(key):
            b = open_by_key[key].pop()
            out.append((key[0], key[1], b["name"], b["ts"], e["ts"]))
        elif ph == "X":
            out.append((key[0], key[1], e["name"], e["ts"], e["ts"] + e.get("dur", 0)))
    return out


def steps(all_spans, names, gap_us):
    """Bursts of gradient allreduces (tensors named by a DistributedOptimizer
    or tape), as [(start, end)]."""
    marks = sorted((s, t) for pid, _, n, s, t in all_spans
                   if "ALLREDUCE" in n and "Distributed" in names.get(pid, ""))
    bursts = []
    for s, t in marks:
        if bursts and s - bursts[-1][1] <= gap_us:
            bursts[-1][1] = max(bursts[-1][1], t)
        else:
            bursts.append([s, t])
    return bursts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("timeline")
    parser.add_argument("output")
    parser.add_argument("--step", type=int, default=10, help="which burst to draw (0-based)")
    parser.add_argument("--gap-ms", type=float, default=1.0)
    args = parser.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(args.timeline) as f:
        events = json.load(f)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    all_spans = spans(events)
    bursts = steps(all_spans, names, args.gap_ms * 1000)
    start, end = bursts[min(args.step, len(bursts) - 1)]
    chosen = [s for s in all_spans if s[4] >= start and s[3] <= end
              and "Distributed" in names.get(s[0], "")]
    start = min(s[3] for s in chosen)
    pids = sorted({s[0] for s in chosen}, key=lambda p: min(s[3] for s in chosen if s[0] == p))
    colours = {}
    palette = ["#9e9e9e", "#f4a259", "#5b8e7d", "#8cb369", "#bc4b51", "#4d7ea8", "#7b5ea7"]
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(pids) + 1.6))
    for row, pid in enumerate(pids):
        for _, tid, name, s, t in (x for x in chosen if x[0] == pid):
            colour = colours.setdefault(name, palette[len(colours) % len(palette)])
            # States above the row's centre line, data-plane work below it.
            ax.barh(row + (0.18 if tid else -0.18), max((t - s) / 1000, 0.005),
                    left=(s - start) / 1000, height=0.34, color=colour, edgecolor="black",
                    linewidth=0.3)
    label = [names.get(p, str(p)).split("/")[-1].replace("HorovodAllreduce_", "")[:60]
             for p in pids]
    ax.set_yticks(range(len(pids)), label, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the step's first submission")
    ax.set_title(f"tfring timeline, one training step (burst {args.step} of {len(bursts)})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
