"""Where the suite's time goes: a table by file and by kind.

Run the suite with the profile plugin on (tests/tools/profile_plugin.py)::

    TFRING_TEST_PROFILE=/tmp/profile.jsonl pytest -q
    python tests/tools/durations.py /tmp/profile.jsonl [--top 30] [--markdown]

Each test's wall time is split into kinds from what it did, not from what it
says it does:

- ``launch``: its multi-process jobs (tfringrun, mpiexec, other Pythons):
  the children's CPU time, which is start-up (TensorFlow's import is most of
  it) and the ranks' work;
- ``compile``: children's CPU in a test that ran a compiler or build tool;
- ``in-process``: the pytest process's own CPU;
- ``waiting``: wall time that no CPU accounts for, with the machine's cores
  counted (timeouts, sleeps, peers that wait for each other). Work done in
  processes the test does not reap itself counts here too: Ray's workers
  and Spark's JVM are children of Ray's and Spark's own daemons, so a Ray or
  Spark test's work shows as waiting.

On 2 cores a test whose children keep both busy shows twice its wall time of
CPU; the kinds are scaled down to the wall time then, so that each row adds
up to its test's wall time.

Under pytest-xdist (the default: two workers) the rows add up to more than
the run took, as two tests run at once; the lines after the table give each
worker's share and the run's span. A test's `waiting` then includes the time
its children waited for the cores the other worker's test was using.
"""
import argparse
import collections
import json
import os


def _split(record, cores):
    wall, own, kids = record["wall"], record["self_cpu"], record["child_cpu"]
    busy = (own + kids) / cores
    scale = min(1.0, wall / busy) if busy else 1.0
    own_wall, kids_wall = own / cores * scale, kids / cores * scale
    kind = "compile" if record.get("compiles") else "launch"
    return {"in-process": own_wall, kind: kids_wall, "waiting": max(0.0, wall - own_wall - kids_wall)}


KINDS = ("launch", "compile", "in-process", "waiting")


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def table(records, cores, top, markdown):
    by_file = collections.defaultdict(lambda: collections.Counter())
    launches = collections.Counter()
    for r in records:
        path = r["test"].split("::")[0]
        row = by_file[path]
        row["wall"] += r["wall"]
        row["tests"] += 1
        for kind, seconds in _split(r, cores).items():
            row[kind] += seconds
        launches[path] += r.get("launches", 0) + r.get("pythons", 0)
    total = collections.Counter()
    for row in by_file.values():
        total.update(row)
    head = ["file", "tests", "jobs", "min", *KINDS]
    rows = [[path, str(row["tests"]), str(launches[path]), f"{row['wall'] / 60:.1f}",
             *(f"{row[k] / 60:.1f}" for k in KINDS)]
            for path, row in sorted(by_file.items(), key=lambda kv: -kv[1]["wall"])[:top]]
    rows.append(["all files", str(total["tests"]), str(sum(launches.values())),
                 f"{total['wall'] / 60:.1f}", *(f"{total[k] / 60:.1f}" for k in KINDS)])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(r, widths))) for r in [head, *rows]]
    return "\n".join(lines)


def workers(records):
    """One line per xdist worker (tests, the minutes its tests took, when its
    last test ended) and the run's span: the wall time of the whole run is
    the span, not the sum of the table's rows, when workers ran side by
    side. Empty for a profile without start times (an older one)."""
    if not records or any("start" not in r for r in records):
        return ""
    by_worker = collections.defaultdict(list)
    for r in records:
        by_worker[r.get("worker", "main")].append(r)
    lines = []
    for worker, rs in sorted(by_worker.items()):
        busy = sum(r["wall"] for r in rs)
        end = max(r["start"] + r["wall"] for r in rs)
        lines.append(f"worker {worker}: {len(rs)} tests, {busy / 60:.1f} min of tests, "
                     f"last ended at {end / 60:.1f} min")
    span = max(r["start"] + r["wall"] for r in records) - min(r["start"] for r in records)
    lines.append(f"span of the run's tests: {span / 60:.1f} min")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profile", help="the file TFRING_TEST_PROFILE named")
    p.add_argument("--top", type=int, default=40, help="files to list (the slowest first)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--tests", type=int, default=0, help="also list the N slowest tests")
    args = p.parse_args()
    records = load(args.profile)
    print(table(records, args.cores, args.top, args.markdown))
    summary = workers(records)
    if summary:
        print()
        print(summary)
    if args.tests:
        print()
        for r in sorted(records, key=lambda r: -r["wall"])[:args.tests]:
            print(f"{r['wall']:8.1f} s  {r['test']}")


if __name__ == "__main__":
    main()
