"""Turns benchmarks/results/*.jsonl into benchmarks/RESULTS.md and PNG plots.

    python benchmarks/report.py [--results-dir benchmarks/results] [--out benchmarks/RESULTS.md]

run_all.py calls it at the end. Plots (busbw against size, tfring against
mpi4py, one per collective and rank count) need matplotlib; without it the
report is written without them and says so.
"""
import argparse
import collections
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_common as bc  # noqa: E402

# Issue 5's targets and the Horovod 0.28.1 figures it quotes (same kind of
# machine: 2 cores, np=2, TF CPU, MPICH wheel).
HOROVOD = {
    "allreduce_64M": "91-94 ms",
    "latency_4K": "1.07 ms",
    "step200": "17.6 ms",
    "efficiency": "0.66 (MPI) - 0.76 (Gloo) vs 2 x np=1",
    "idle": "about 0.99 on rank 0",
}


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def load(results):
    return {name: bc.read_jsonl(os.path.join(results, f"{name}.jsonl"))
            for name in ("collectives", "small_tensors", "idle", "training", "commands",
                         "independent", "profile")}


def read_machine(results):
    path = os.path.join(results, "machine.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------- collectives

def collective_index(records):
    """{np: {collective: {label: {nominal_bytes: record}}}}"""
    idx = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in records:
        idx[r["np"]][r["collective"]].setdefault(r["label"], {})[r["nominal_bytes"]] = r
    return idx


def labels_in_order(by_label):
    order = ["auto", "shm", "ring", "mpi"]
    return sorted(by_label, key=lambda l: (order.index(l) if l in order else len(order), l))


def mpi4py_baseline(by_label, nominal):
    """mpi4py's figure for a size: from the 'auto' launch when there is one
    (its own reference), else the first launch that has the size."""
    for label in labels_in_order(by_label):
        rec = by_label[label].get(nominal)
        if rec:
            return rec
    return None


def is_chain(label):
    return "-chain" in label


def chain_section(records, lines):
    """Per-op figures from collectives.py --chain K launches, a table each."""
    chained = [r for r in records if r.get("chain", 1) > 1]
    for (n, k) in sorted({(r["np"], r["chain"]) for r in chained}):
        rows = sorted((r for r in chained if r["np"] == n and r["chain"] == k),
                      key=lambda r: (r["collective"], r["nominal_bytes"]))
        lines.append(f"### Per op in a chain of {k} in one tf.function, np={n}\n")
        lines += ["| collective | size | tfring ms/op | mpi4py ms/op | ratio | TF floor ms/op |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['collective']} | {bc.human_size(r['nominal_bytes'])} | "
                         f"{ms(r['tfring_s'])} | {ms(r['mpi4py_s'])} | {r['ratio']:.2f}x | "
                         f"{ms(r.get('tf_floor_s'))} |")
        lines.append("")
        lines.append(f"Each call runs {k} collectives, each consuming the last one's output, "
                     f"against {k} mpi4py calls doing the same; times are per op. TF floor: "
                     "a tf.function returning tf.identity, timed in the same iterations, "
                     f"divided by {k}.\n")


def collectives_section(records, lines, plots):
    chain_section(records, lines)
    records = [r for r in records if r.get("chain", 1) == 1]
    idx = collective_index(records)
    if not idx:
        lines.append("_No collective results._\n")
        return
    for n in sorted(idx):
        for coll in ("allreduce", "allgather", "broadcast"):
            by_label = idx[n].get(coll)
            if not by_label:
                continue
            labels = labels_in_order(by_label)
            sizes = sorted({s for lab in by_label.values() for s in lab})
            any_rec = next(iter(next(iter(by_label.values())).values()))
            lines.append(f"### {coll}, np={n} (busbw factor {any_rec['busbw_factor']:.3g})\n")
            head = "| size |"
            rule = "|---:|"
            for lab in labels:
                head += f" tfring[{lab}] ms | busbw GB/s |"
                rule += "---:|---:|"
            head += " mpi4py ms | busbw GB/s |"
            rule += "---:|---:|"
            for lab in labels:
                head += f" ratio[{lab}] |"
                rule += "---:|"
            lines += [head, rule]
            for s in sizes:
                row = f"| {bc.human_size(s)} |"
                for lab in labels:
                    rec = by_label[lab].get(s)
                    row += (f" {ms(rec['tfring_s'])} | {fmt(rec['tfring_busbw'])} |" if rec
                            else " - | - |")
                base = by_label.get("auto", {}).get(s) or mpi4py_baseline(by_label, s)
                row += f" {ms(base['mpi4py_s'])} | {fmt(base['mpi4py_busbw'])} |"
                for lab in labels:
                    rec = by_label[lab].get(s)
                    row += f" {rec['ratio']:.2f}x |" if rec else " - |"
                lines.append(row)
            lines.append("")
            lines.append("ratio[X] = tfring busbw / mpi4py busbw, both measured in launch X "
                         "(interleaved iterations). The mpi4py column is from the "
                         f"`{'auto' if 'auto' in by_label else labels[0]}` launch.\n")
            png = f"{coll}_busbw_np{n}.png"
            if png in plots:
                lines.append(f"![{coll} busbw np={n}](results/{png})\n")


def make_plots(records, results):
    """Writes one PNG per (collective, np); returns the file names written, or
    None when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        print("report.py: matplotlib is not installed; skipping plots "
              "(pip install matplotlib)", file=sys.stderr)
        return None
    written = []
    idx = collective_index(records)
    for n, colls in idx.items():
        for coll, by_label in colls.items():
            fig, ax = plt.subplots(figsize=(7, 4.5))
            labels = labels_in_order(by_label)
            # One colour per launch: tfring solid, mpi4py (same launch) dashed.
            for i, lab in enumerate(labels):
                recs = [by_label[lab][s] for s in sorted(by_label[lab])]
                ax.plot([r["bytes"] for r in recs], [r["tfring_busbw"] for r in recs],
                        marker="o", color=f"C{i}", label=f"tfring ({lab} plane)")
                ax.plot([r["bytes"] for r in recs], [r["mpi4py_busbw"] for r in recs],
                        marker="x", linestyle="--", color=f"C{i}",
                        label=f"mpi4py (in the {lab} launch)")
            sizes = sorted({s for lab in by_label.values() for s in lab})
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(FixedLocator(sizes))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(sizes, [bc.human_size(s) for s in sizes])
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel("busbw (GB/s)")
            ax.set_title(f"{coll} float32, np={n}: bus bandwidth (median)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            name = f"{coll}_busbw_np{n}.png"
            fig.savefig(os.path.join(results, name), dpi=110)
            plt.close(fig)
            written.append(name)
    return written


# --------------------------------------------------------------------------- other parts

def small_section(records, lines):
    if not records:
        lines.append("_No small-tensor results._\n")
        return
    lines += ["| launch | np | TFRING_CACHE_CAPACITY | 200 x 4 KB step, median ms | q1-q3 ms "
              "| TF floor (200 multiplies) ms |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in records:
        s, f = r["step200"], r["floor200"]
        lines.append(f"| {r['label']} | {r['np']} | {r['cache_capacity']} | {ms(s['median'])} | "
                     f"{ms(s['q1'])}-{ms(s['q3'])} | {ms(f['median'])} |")
    lines.append("")
    lines += ["Single 4 KB float32 allreduce and TF dispatch latency (median ms, "
              "slowest rank per call):", ""]
    keys = ["function_allreduce", "eager_allreduce", "mpi4py_allreduce", "function_identity",
            "eager_identity"]
    lines += ["| launch | " + " | ".join(keys) + " | target: 1.5 x (mpi4py + identity fn) |",
              "|---|" + "---:|" * (len(keys) + 1)]
    for r in records:
        lat = r["latency"]
        lines.append(f"| {r['label']} | " + " | ".join(ms(lat[k]["median"]) for k in keys) +
                     f" | {ms(r['latency_target_s'])} |")
    lines.append("")


def idle_section(records, lines):
    if not records:
        lines.append("_No idle-CPU results._\n")
        return
    lines += ["| rank | idle s | CPU-s/s (/proc) | CPU-s/s (getrusage) | before hvd.init | "
              "threads | busiest threads (CPU s) |",
              "|---:|---:|---:|---:|---:|---:|---|"]
    for r in sorted(records, key=lambda r: r["rank"]):
        i, b = r["idle"], r.get("baseline")
        busy = ", ".join(f"{t['name']}[{t['tid']}] {t['cpu_s']:.3f}"
                         for t in i["busy_threads"][:3]) or "-"
        lines.append(f"| {r['rank']} | {i['wall_s']:.1f} | {i['cpu_per_s']:.4f} | "
                     f"{i['rusage_cpu_per_s']:.4f} | "
                     f"{fmt(b['rusage_cpu_per_s'], 4) if b else '-'} | {i['threads']} | {busy} |")
    lines.append("")


def window_rate(ends, t0, t1, batch):
    inside = [t for t in ends if t0 <= t <= t1]
    if len(inside) < 2:
        return None
    return (len(inside) - 1) * batch / (inside[-1] - inside[0])


def _run_totals(by):
    """Totals of one repetition's runs: np=1, np=2 and the ceiling (two
    independent np=1 runs counted over the window in which both ran)."""
    out = {}
    for label in ("np1", "np2"):
        if by.get(label):
            out[label] = {"total": sum(r["images_per_sec"] for r in by[label]),
                          "per_rank": [r["images_per_sec"] for r in by[label]],
                          "batches": by[label][0]["steps"], "np": by[label][0]["np"],
                          "load": by[label][0].get("load_before")}
    indep = by.get("indep", [])
    if len(indep) >= 2:
        t0 = max(r["batch_end_times"][0] for r in indep)
        t1 = min(r["batch_end_times"][-1] for r in indep)
        span = max(r["batch_end_times"][-1] for r in indep) - min(r["batch_end_times"][0]
                                                                   for r in indep)
        rates = [window_rate(r["batch_end_times"], t0, t1, r["batch_size"]) for r in indep]
        if all(rates):
            out["indep"] = {"total": sum(rates), "per_rank": rates,
                            "alone": [r["images_per_sec"] for r in indep],
                            "overlap_s": t1 - t0, "overlap_frac": (t1 - t0) / span,
                            "load": indep[0].get("load_before")}
    return out


def training_numbers(records):
    """The first repetition's runs for the table, and the ratios: each np=2
    run against the ceiling run of its own repetition (launched right before
    or after it), summarised by the median over repetitions."""
    reps = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        reps[r.get("rep", 0)][r["label"]].append(r)
    totals = {rep: _run_totals(by) for rep, by in sorted(reps.items())}
    np1 = next((t["np1"] for t in totals.values() if "np1" in t), None)
    out = {}
    for t in totals.values():
        for label, x in t.items():
            out.setdefault(label, x)
    if np1:
        out["np1"] = np1
    ratios = [(rep, t["np2"]["total"] / t["indep"]["total"], t["np2"].get("load"),
               t["indep"].get("load"))
              for rep, t in totals.items() if "np2" in t and "indep" in t]
    if ratios:
        values = sorted(x[1] for x in ratios)
        out["efficiency_vs_ceiling"] = statistics.median(values)
        out["ceiling_ratios"] = ratios
    if np1 and "np2" in out:
        out["efficiency"] = statistics.median(
            t["np2"]["total"] for t in totals.values() if "np2" in t) / (2 * np1["total"])
    if np1 and "indep" in out:
        out["ceiling"] = statistics.median(
            t["indep"]["total"] for t in totals.values() if "indep" in t) / (2 * np1["total"])
    return out


def _load(value):
    return "?" if value is None else f"{value:.1f}"


def training_section(records, lines):
    t = training_numbers(records)
    if not t:
        lines.append("_No training results._\n")
        return t
    first = records[0]
    lines.append(f"Model: small CNN, {first['params']:,} parameters; batch {first['batch_size']} "
                 f"per rank; {first['image_size']}x{first['image_size']}x3 synthetic images; "
                 f"{first['threads']} intra-op and inter-op thread(s) per rank; Keras "
                 f"{first.get('keras_version')} `model.fit`, `jit_compile=False`.\n")
    lines += ["| run | images/sec per rank | total images/sec | measured batches |",
              "|---|---|---:|---:|"]
    for label, name in (("np1", "np=1"), ("np2", "np=2 (tfring)"),
                        ("indep", "2 x independent np=1 at once (ceiling)")):
        if label in t:
            x = t[label]
            per = ", ".join(f"{v:.1f}" for v in x["per_rank"])
            extra = x.get("batches", "")
            if label == "indep":
                extra = (f"overlap window {x['overlap_s']:.1f} s "
                         f"({x['overlap_frac']:.0%} of the span)")
            lines.append(f"| {name} | {per} | {x['total']:.1f} | {extra} |")
    lines.append("")
    if "efficiency" in t:
        lines.append(f"- scaling efficiency total(np=2) / (2 x np=1): **{t['efficiency']:.3f}**")
    if "efficiency_vs_ceiling" in t:
        each = "; ".join(f"rep {rep}: {ratio:.3f} (load {_load(l2)} / {_load(li)})"
                         for rep, ratio, l2, li in t["ceiling_ratios"])
        lines.append(f"- against the no-communication ceiling total(np=2) / total(2 x "
                     f"independent), each np=2 run against the ceiling run beside it, median "
                     f"of {len(t['ceiling_ratios'])}: **{t['efficiency_vs_ceiling']:.3f}** "
                     f"({each}; 1-minute load average before the np=2 / ceiling launch)")
    if "ceiling" in t:
        lines.append(f"- the machine's own ceiling total(2 x independent) / (2 x np=1): "
                     f"{t['ceiling']:.3f}")
    lines.append("")
    return t


# --------------------------------------------------------------------------- targets

def targets_section(data, training, lines):
    coll = collective_index(data["collectives"])
    small = {r["label"]: r for r in data["small_tensors"] if r["np"] == 2}
    idle = data["idle"]
    rows = []

    def ar(nominal):
        return coll.get(2, {}).get("allreduce", {}).get("auto", {}).get(nominal)

    for nominal, goal, key in ((64 * bc.MB, 3.0, "allreduce_64M"), (bc.MB, 1.5, None)):
        r = ar(nominal)
        if r:
            got = (f"{r['ratio']:.2f}x ({ms(r['tfring_s'])} ms vs MPI {ms(r['mpi4py_s'])} ms; "
                   f"busbw {r['tfring_busbw']:.2f} vs {r['mpi4py_busbw']:.2f} GB/s)")
            met = "yes" if r["ratio"] >= goal else "no"
        else:
            got, met = "not measured", "-"
        rows.append((f"{bc.human_size(nominal)} allreduce np=2: busbw >= {goal}x MPICH "
                     "(same run)", got, met, HOROVOD.get(key, "")))
    on = small.get("cache_on")
    if on:
        lat = on["latency"]
        f = lat["function_allreduce"]["median"]
        goal = on["latency_target_s"]
        got = (f"{ms(f)} ms in tf.function (eager {ms(lat['eager_allreduce']['median'])} ms); "
               f"limit 1.5 x ({ms(lat['mpi4py_allreduce']['median'])} + "
               f"{ms(lat['function_identity']['median'])}) = {ms(goal)} ms")
        rows.append(("4 KB allreduce np=2: latency <= 1.5 x (mpi4py + TF dispatch)", got,
                     "yes" if f <= goal else "no", HOROVOD["latency_4K"]))
        s = on["step200"]["median"]
        off = small.get("cache_off")
        got = f"{ms(s)} ms" + (f" (cache off: {ms(off['step200']['median'])} ms)" if off else "")
        rows.append(("200 x 4 KB tf.function step np=2: <= 2 ms", got,
                     "yes" if s <= 2e-3 else "no", HOROVOD["step200"]))
    else:
        rows.append(("4 KB allreduce np=2 latency", "not measured", "-", HOROVOD["latency_4K"]))
        rows.append(("200 x 4 KB step np=2: <= 2 ms", "not measured", "-", HOROVOD["step200"]))
    if "efficiency_vs_ceiling" in training:
        e = training["efficiency_vs_ceiling"]
        got = f"{e:.3f} (vs 2 x np=1: {training.get('efficiency', float('nan')):.3f})"
        rows.append(("Training np=2: >= 0.97 of the no-communication ceiling", got,
                     "yes" if e >= 0.97 else "no", HOROVOD["efficiency"]))
    else:
        rows.append(("Training np=2: >= 0.97 of the ceiling", "not measured", "-",
                     HOROVOD["efficiency"]))
    if idle:
        worst = max(r["idle"]["cpu_per_s"] for r in idle)
        got = ", ".join(f"rank {r['rank']}: {r['idle']['cpu_per_s']:.4f}"
                        for r in sorted(idle, key=lambda r: r["rank"])) + " CPU-s/s"
        rows.append((f"Idle cost at np={idle[0]['np']}: <= 0.02 CPU-s/s per rank", got,
                     "yes" if worst <= 0.02 else "no", HOROVOD["idle"]))
    else:
        rows.append(("Idle cost <= 0.02 CPU-s/s per rank", "not measured", "-", HOROVOD["idle"]))
    lines += ["| target (issue 5) | achieved (medians) | met | Horovod 0.28.1 here |",
              "|---|---|:---:|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines.append("")


def issue10_section(data, training, lines):
    """Issue 10's target table: every ratio from one run, side by side."""
    coll = collective_index(data["collectives"])
    small = {r["label"]: r for r in data["small_tensors"] if r["np"] == 2}
    indep = {(r["np"], r["bytes"]): r for r in data["independent"]}
    rows = []

    def get(np_, c, nominal):
        return coll.get(np_, {}).get(c, {}).get("auto", {}).get(nominal)

    on = small.get("cache_on")
    chain = (on or {}).get("chain_per_op")
    if chain:
        c = chain["chain"]["median"]
        rows.append((f"4 KB allreduce, per op in a chain of {on['chain_length']} in one "
                     "tf.function", f"{c * 1e6:.0f} us (mpi4py loop {chain['chain_mpi4py']['median'] * 1e6:.0f} us, "
                     f"TF chain of multiplies {chain['chain_floor']['median'] * 1e6:.0f} us per op)",
                     "<= 50 us", "yes" if c <= 50e-6 else "no"))
    def chained(c, nominal):
        """The per-op figure for a size from a --chain launch, if one ran."""
        by_label = coll.get(2, {}).get(c, {})
        for label in sorted(by_label):
            if is_chain(label) and nominal in by_label[label]:
                return by_label[label][nominal]
        return None

    def floor_note(r):
        f = r.get("tf_floor_s")
        return f"; TF floor {ms(f)} ms" if f is not None else ""

    def met(ratio, goal, ch):
        verdict = "yes" if ratio >= goal else "no"
        if ch:
            verdict += f" (per op in a chain: {'yes' if ch['ratio'] >= goal else 'no'})"
        return verdict

    r = get(2, "allreduce", bc.MB)
    if r:
        ch = chained("allreduce", bc.MB)
        got = f"{r['ratio']:.2f}x per call ({ms(r['tfring_s'])} vs {ms(r['mpi4py_s'])} ms{floor_note(r)})"
        if ch:
            got += (f"; per op in a chain of {ch['chain']} {ch['ratio']:.2f}x "
                    f"({ms(ch['tfring_s'])} vs {ms(ch['mpi4py_s'])} ms)")
        rows.append(("1 MB allreduce busbw vs mpi4py", got, ">= 1.2x", met(r["ratio"], 1.2, ch)))
    for np_, goal in ((2, 2.5), (3, 3.0)):
        r = get(np_, "allreduce", 64 * bc.MB)
        i = indep.get((np_, 64 * bc.MB))
        parts, ok = [], []
        if r:
            parts.append(f"collectives.py {r['ratio']:.2f}x ({ms(r['tfring_s'])} vs "
                         f"{ms(r['mpi4py_s'])} ms)")
            ok.append(r["ratio"] >= goal)
        if i:
            parts.append(f"independent method {i['ratio']:.2f}x ({ms(i['tfring']['median'])} vs "
                         f"{ms(i['mpi4py']['median'])} ms; without .numpy() "
                         f"{i['ratio_no_numpy']:.2f}x; TF's own x*1.0 + .numpy() "
                         f"{ms(i['floor']['median'])} ms)")
            ok.append(i["ratio"] >= goal)
        if parts:
            rows.append((f"64 MB allreduce busbw vs mpi4py, np={np_}", "; ".join(parts),
                         f">= {goal}x under both", "yes" if all(ok) and len(ok) == 2 else "no"))
    for c in ("broadcast", "allgather"):
        sizes = (bc.MB, 4 * bc.MB, 16 * bc.MB, 64 * bc.MB)
        rs = [x for x in (get(2, c, nb) for nb in sizes) if x]
        chs = [x for x in (chained(c, nb) for nb in sizes) if x]
        if rs:
            worst = min(rs, key=lambda x: x["ratio"])
            got = "per call " + ", ".join(f"{bc.human_size(x['nominal_bytes'])} "
                                          f"{x['ratio']:.2f}x" for x in rs)
            verdict = "yes" if worst["ratio"] >= 1.0 else "no"
            if chs:
                got += (f"; per op in a chain of {chs[0]['chain']} " +
                        ", ".join(f"{bc.human_size(x['nominal_bytes'])} {x['ratio']:.2f}x"
                                  for x in chs))
                verdict += (" (per op in a chain: "
                            f"{'yes' if min(x['ratio'] for x in chs) >= 1.0 else 'no'})")
            rows.append((f"{c} 1-64 MB vs mpi4py, np=2", got, ">= 1.0x", verdict))
    if on:
        s, f = on["step200"]["median"], on["floor200"]["median"]
        rows.append(("200 x 4 KB step vs TF's 200-op floor (same run)",
                     f"floor + {ms(s - f)} ms ({ms(s)} vs {ms(f)} ms)", "floor + 0.5 ms",
                     "yes" if s - f <= 0.5e-3 else "no"))
    if "efficiency_vs_ceiling" in training:
        e = training["efficiency_vs_ceiling"]
        spread = [x[1] for x in training["ceiling_ratios"]]
        got = f"{e:.3f}" + (f" (median of {len(spread)} interleaved pairs, "
                            f"{min(spread):.3f}-{max(spread):.3f})" if len(spread) > 1 else "")
        rows.append(("Keras CNN training vs the no-communication ceiling", got, ">= 0.93",
                     "yes" if e >= 0.93 else "no"))
    idle = data["idle"]
    if idle:
        worst = max(r["idle"]["cpu_per_s"] for r in idle)
        rows.append(("idle CPU per rank", f"{worst:.4f} CPU-s/s (worst rank)", "<= 0.02",
                     "yes" if worst <= 0.02 else "no"))
    for t in (r for r in data["profile"] if r.get("bench") == "timeline"):
        rows.append(("a training step on the timeline, np=2 rank 0 (medians over "
                     f"{t['steps']} steps)",
                     f"step {t['step_ms']:.1f} ms; first submission to last plane call's end "
                     f"{t['comm_span_ms']:.1f} ms; first submission to first plane call "
                     f"{t['first_wait_ms']:.1f} ms; data planes {t['data_plane_ms']:.1f} ms "
                     f"(incl. waits for peers); fusion copies {t['copies_ms']:.2f} ms; "
                     f"{t['responses']:.0f} responses", "(reported)", "-"))
    prof = [r for r in data["profile"] if r.get("profile")]
    for r in sorted(prof, key=lambda r: (r["np"], r["rank"])):
        p = r["profile"]
        bg = p["cpu_per_s"].get("tfring-bg", 0.0)
        rows.append((f"background thread CPU during training, np={r['np']} rank {r['rank']}",
                     f"{bg:.3f} CPU-s/s, {p['cpu_ms_per_step'].get('tfring-bg', 0.0):.1f} ms per "
                     f"step (TF compute {p['cpu_ms_per_step'].get('tf_Compute', 0.0):.1f} ms per "
                     "step)", "(reported)", "-"))
    lines += ["| row (issue 10) | achieved (medians, this run) | target | met |",
              "|---|---|---|:---:|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    lines.append("")


# --------------------------------------------------------------------------- misc

def machine_section(m, lines):
    if not m:
        lines.append("_No machine.json (run run_all.py)._\n")
        return
    lib = m.get("library") or {}
    rows = [
        ("date", f"{m.get('date')} to {m.get('finished')}"),
        ("CPU", f"{m.get('cpu_model')}, nproc = {m.get('nproc')}"),
        ("memory", m.get("memory")),
        ("load average at start / end", f"{m.get('loadavg_start')} / {m.get('loadavg_end')}"),
        ("kernel, Python", f"{m.get('kernel')}, {m.get('python')}"),
        ("TensorFlow, Keras", f"{m.get('tensorflow')}, {m.get('keras')}"),
        ("MPI", f"{m.get('mpi_library')} (mpich wheel {m.get('mpich_wheel')}), "
                f"mpi4py {m.get('mpi4py')}"),
        ("numpy, matplotlib", f"{m.get('numpy')}, {m.get('matplotlib')}"),
        ("git", f"{m.get('git_head')} ({m.get('git_dirty')} changed files under tf_ops/, "
                "tfring/)"),
        ("op library", f"{lib.get('path')} built {lib.get('built')}"),
    ]
    lines += ["| | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows] + [""]
    newer = lib.get("sources_newer_than_library") or []
    if newer:
        lines.append(f"**Warning: the op library is older than {len(newer)} C++ source file(s) "
                     f"({', '.join(newer[:6])}{', ...' if len(newer) > 6 else ''}); these "
                     "numbers are from the library as built, not from the current sources. "
                     "Rebuild (`pip install --no-build-isolation -e .`) and rerun.**\n")


def log_warnings(results):
    """Distinct tfring warnings/errors printed by any launch, with counts."""
    seen = collections.Counter()
    where = {}
    logs = os.path.join(results, "logs")
    if not os.path.isdir(logs):
        return []
    for name in sorted(os.listdir(logs)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(logs, name), errors="replace") as f:
            for line in f:
                if "[tfring WARNING" in line or "[tfring ERROR" in line:
                    msg = re.sub(r"^\[\d+\]<std(out|err)>:", "", line.strip())
                    msg = re.sub(r" rank -?\d+\]", "]", msg)
                    seen[msg] += 1
                    where.setdefault(msg, set()).add(name[:-4])
    return [(m, c, sorted(where[m])) for m, c in seen.most_common()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    args = p.parse_args(argv)
    results = os.path.abspath(args.results_dir)
    data = load(results)
    machine = read_machine(results)
    per_call = [r for r in data["collectives"] if r.get("chain", 1) == 1]
    plots = make_plots(per_call, results) if per_call else []

    L = ["# tfring benchmark results", ""]
    if machine.get("quick"):
        L += ["> **QUICK SMOKE RUN** (`--quick`): tiny sizes and durations, to check that the "
              "suite works. These numbers mean nothing; run `bash benchmarks/run_all.sh` "
              "for real ones.", ""]
    L += ["Generated by `benchmarks/report.py` from `benchmarks/results/*.jsonl`. How the "
          "numbers are taken, and caveats: `benchmarks/README.md`. Times are medians.", ""]
    L += ["## Machine", ""]
    machine_section(machine, L)

    training = training_numbers(data["training"])
    L += ["## Targets of issue 10", ""]
    issue10_section(data, training, L)
    breakdown = os.path.join(HERE, "BREAKDOWN.md")
    if os.path.exists(breakdown):
        # Hand-written: the profile of a training step and what it decided.
        with open(breakdown) as f:
            L += [f.read().strip(), ""]
    L += ["## Targets of issue 5", ""]
    targets_section(data, training, L)

    L += ["## Collectives: tfring op in tf.function vs mpi4py on numpy", ""]
    L.append("Sizes as in nccl-tests (allgather: the gathered output). algbw = bytes / time; "
             "busbw = algbw x 2(n-1)/n (allreduce), x (n-1)/n (allgather), x 1 (broadcast); "
             "GB = 1e9 bytes. `tfring[auto]` is the default data-plane choice, "
             "`tfring[mpi]` forces MPI (`TFRING_CPU_OPERATIONS=mpi`).\n")
    if plots is None:
        L.append("_Plots skipped: matplotlib is not installed (`pip install matplotlib`, then "
                 "`python benchmarks/report.py`)._\n")
    collectives_section(data["collectives"], L, plots or [])

    L += ["## Many small tensors and 4 KB latency (np=2)", ""]
    small_section(data["small_tensors"], L)

    L += ["## Idle CPU cost", ""]
    L.append("Process CPU time (utime + stime) over a sleep after init and a few collectives, "
             "per second of wall time. 'before hvd.init' is the same process with TF and MPI "
             "loaded but no tfring background thread.\n")
    idle_section(data["idle"], L)

    L += ["## Training throughput", ""]
    training_section(data["training"], L)

    warnings = log_warnings(results)
    L += ["## tfring warnings in the logs", ""]
    if warnings:
        L += [f"- `{m}` x{c} ({', '.join(w)})" for m, c, w in warnings]
    else:
        L.append("None.")
    L.append("")

    L += ["## Commands", "", "Run from the repository root by `benchmarks/run_all.py` "
          f"(arguments: `{' '.join(machine.get('run_all_args') or []) or '(none)'}`); "
          "full output of each in `benchmarks/results/logs/NAME.log`.", "", "```"]
    for c in data["commands"]:
        status = "" if c["rc"] == 0 else f"   # FAILED: {c['rc']}"
        L.append(f"# {c['name']} ({c['wall_s']} s){status}")
        L.append(c["command"])
    L += ["```", ""]

    with open(args.out, "w") as f:
        f.write("\n".join(L))
    print(f"report.py: wrote {os.path.relpath(args.out)}"
          + (f" and {len(plots)} plot(s) in {os.path.relpath(results)}" if plots else ""))


if __name__ == "__main__":
    main()
