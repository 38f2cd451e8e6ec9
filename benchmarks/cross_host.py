"""Allreduce across fake hosts with shaped links: tfring beside Gloo and MPICH
(issue 26's benchmark).

    python benchmarks/cross_host.py [--quick] [--rates 1gbit,2500mbit,5gbit,unlimited]
                                    [--layouts 2x1,3x1,4x1,2x2] [--rounds N]
                                    [--libs tcp,tcp-tf,tcp-hier,mpi,mpich,gloo,tcp-ring,tcp-rd,tcp-rab]
                                    [--sizes "4 KB,64 KB,1 MB,16 MB,64 MB"] [--json out.json]
                                    [--md benchmarks/RESULTS_CROSS_HOST.md]

Fake hosts are network namespaces joined by a bridge (tests/netns_support.py;
needs root); `--rates` limits each host's veth, in both directions, with a
token bucket (tc tbf: netem, for latency, is not in this kernel). A layout
HxR is H fake hosts with R ranks each. On the same hosts, one after the other
(the order rotating between rounds), run:
  tcp       tfring, `tfringrun --tcp -H h0:R,...` (the default planes),
            tfring.core's in-place allreduce_ on a numpy array;
  tcp-tf    the same through the TensorFlow eager op (tfring.tensorflow's
            allreduce: a fresh output tensor per call; no .numpy());
  tcp-hier  tcp with TFRING_HIERARCHICAL_ALLREDUCE=1 (layouts with R > 1);
  tcp-ring, tcp-rd, tcp-rab
            tcp with TFRING_ALLREDUCE_ALGORITHM=ring, recursive_doubling or
            rabenseifner forced (tcp itself chooses: auto);
  mpi       tcp's loop under `tfringrun --mpi -H ...` (MPICH hydra over the
            fake ssh);
  mpich     MPI_Allreduce through mpi4py on numpy arrays, same mpiexec;
  gloo      torch.distributed all_reduce in place, backend gloo (benchmark
            only; torch is no dependency of tfring).
With any of the forced algorithms, a second table gives each size's median
time per library and auto's time over the fastest forced algorithm's.
Every library runs the same loop on buffers it keeps (in place, as DDP and
Horovod reduce gradients): each call lined up by a tiny allreduce, the
slowest rank's median, the process CPU per call. Rows: 4 KB latency, 1 MB
and 64 MB busbw (nccl-tests: bytes / time * 2(n-1)/n) as a fraction of the
ceiling, one raw one-way TCP stream between two of the hosts over the same
shaped link, measured in the same run before and after the libraries (the
higher kept), beside half a 4 KB TCP ping-pong (one hop's latency). Also recorded:
the bytes each run put on the hosts' links (their veth counters), so that
hierarchical and flat can be compared by link traffic.

Every namespace, veth, qdisc and process is removed on exit, on failure and
on Ctrl-C/SIGTERM; every launch has a timeout.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import bench_common as bc  # noqa: E402
import transport  # noqa: E402

# transport.py's sizes and, for the allreduce algorithms' cut-overs, more.
SIZES = dict(sorted({**transport.SIZES, "64 KB": 64 << 10, "16 MB": 16 << 20}.items(),
                    key=lambda kv: kv[1]))
LIBS = ("tcp", "tcp-tf", "tcp-hier", "mpi", "mpich", "gloo", "tcp-ring", "tcp-rd", "tcp-rab")
LIB_NAMES = {"tcp": "tfring --tcp", "tcp-tf": "tfring --tcp, TF op", "tcp-hier":
             "tfring --tcp hier.", "mpi": "tfring --mpi", "tcp-tf-base": "baseline: TF op",
             "mpich": "MPICH (mpi4py)", "gloo": "Gloo (torch)",
             "tcp-ring": "tfring --tcp, ring", "tcp-rd": "tfring --tcp, recursive doubling",
             "tcp-rab": "tfring --tcp, Rabenseifner"}
# The forced algorithms (TFRING_ALLREDUCE_ALGORITHM) beside auto ("tcp").
ALGORITHMS = {"tcp-ring": "ring", "tcp-rd": "recursive_doubling", "tcp-rab": "rabenseifner"}
RATE_GBIT = {"1gbit": 1.0, "2500mbit": 2.5, "5gbit": 5.0, "unlimited": None}


# ---------------------------------------------------------------- rank side

DETAIL = ("user_s", "sys_s", "voluntary_switches", "involuntary_switches")


def _usage():
    import resource
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime, r.ru_stime, r.ru_nvcsw, r.ru_nivcsw)


def _timed_rows(sizes, allreduce, line_up, back_to_back=False):
    """{label: [median seconds, CPU seconds, *DETAIL]}, the rusage figures
    per call (line-up included) of this process, all its threads.

    Each timed call starts after a line-up (a one-element allreduce), or,
    with `back_to_back`, right after the one before it (one line-up per
    size). On a token-bucket link the line-up's own length is idle time in
    which the bucket refills, so a size the link's rate binds looks faster
    after a slower line-up: comparing algorithms there (each library's
    line-up is its own allreduce, and auto's is recursive doubling where a
    forced ring's is the ring), back to back is the fair measure."""
    import numpy as np
    rows = {}
    for label in sizes:
        nbytes = SIZES[label]
        x = np.ones(nbytes // 4, np.float32)
        times, u0 = [], None
        if back_to_back:
            line_up()
        for i in range(transport.reps_for(nbytes) + 3):
            if i == 3:
                u0 = _usage()
            if not back_to_back:
                line_up()
            t0 = time.perf_counter()
            allreduce(x)
            if i >= 3:
                times.append(time.perf_counter() - t0)
        per_call = [(v1 - v0) / len(times) for v0, v1 in zip(u0, _usage())]
        rows[label] = [statistics.median(times), per_call[0] + per_call[1], *per_call]
    return rows


def tfring_rank(args):
    """tfring under tfringrun: the core's in-place allreduce_ on numpy
    arrays (as Gloo and MPICH run here), or with --tf the TensorFlow eager
    op (a fresh output tensor per call, no .numpy())."""
    import numpy as np
    if args.rank_mode == "tfring-tf":
        import tensorflow as tf
        import tfring.tensorflow as hvd
        hvd.init()
        size = hvd.size()
        one = tf.ones([1])
        tensors = {SIZES[k] // 4: tf.ones([SIZES[k] // 4]) for k in args.sizes}
        for t in tensors.values():
            out = hvd.allreduce(t, op=hvd.Sum, name=f"check{t.shape[0]}").numpy()
            assert out[0] == size and out[-1] == size

        def allreduce(x):
            hvd.allreduce(tensors[x.size], op=hvd.Sum, name="bench")

        def line_up():
            hvd.allreduce(one, op=hvd.Sum, name="line_up")

        def slowest(values):
            return hvd.allreduce(tf.constant(values, tf.float64), op=hvd.Max,
                                 name="slowest").numpy().tolist()
    else:
        import tfring.core as hvd
        hvd.init()
        size = hvd.size()
        one = np.ones(1, np.float32)
        # In place, one array per size, checked once and then kept at zero.
        arrays = {SIZES[k] // 4: np.ones(SIZES[k] // 4, np.float32) for k in args.sizes}
        for a in arrays.values():
            hvd.allreduce_(a, op=hvd.Sum, name=f"check{a.size}")
            assert a[0] == size and a[-1] == size
            a[:] = 0

        def allreduce(x):
            hvd.allreduce_(arrays[x.size], op=hvd.Sum, name="bench")

        def line_up():
            hvd.allreduce_(one, op=hvd.Sum, name="line_up")

        def slowest(values):
            return hvd.allreduce(np.array(values), op=hvd.Max, name="slowest").tolist()
    rows = _timed_rows(args.sizes, allreduce, line_up, args.back_to_back)
    _write(args.out, hvd.rank(), {k: slowest(list(v)) for k, v in rows.items()})
    hvd.shutdown()


def mpich_rank(args):
    from mpi4py import MPI
    import numpy as np
    comm = MPI.COMM_WORLD
    one, out1 = np.ones(1, np.float32), np.empty(1, np.float32)
    outs = {}

    def allreduce(x):
        out = outs.setdefault(x.size, np.empty_like(x))
        comm.Allreduce(x, out, op=MPI.SUM)
        assert out[0] == comm.size and out[-1] == comm.size

    rows = _timed_rows(args.sizes, allreduce, lambda: comm.Allreduce(one, out1),
                       args.back_to_back)
    _write(args.out, comm.rank, {k: [comm.allreduce(v, op=MPI.MAX) for v in rows[k]]
                                 for k in rows})


def gloo_rank(args):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    size = dist.get_world_size()
    one = torch.ones(1)
    # In place, as DDP reduces .grad: one tensor per size, checked once and
    # then reduced again and again.
    tensors = {SIZES[k] // 4: torch.ones(SIZES[k] // 4) for k in args.sizes}
    for t in tensors.values():
        dist.all_reduce(t)
        assert t[0] == size and t[-1] == size
        t.zero_()  # stays finite however often it is reduced

    def timed_allreduce(x):
        dist.all_reduce(tensors[x.size])

    rows = _timed_rows(args.sizes, timed_allreduce, lambda: dist.all_reduce(one),
                       args.back_to_back)
    result = {}
    for k, values in rows.items():
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        result[k] = t.tolist()
    _write(args.out, dist.get_rank(), result)
    dist.destroy_process_group()


def _write(path, rank, rows):
    if rank == 0:
        with open(path, "w") as f:
            json.dump({"rows": {k: v[0] for k, v in rows.items()},
                       "cpu_per_call": {k: v[1] for k, v in rows.items()},
                       "detail": {k: dict(zip(DETAIL, v[2:])) for k, v in rows.items()}}, f)


# ---------------------------------------------------------------- launcher side

class Failed(Exception):
    pass


def run(cmd, env, timeout, out=None):
    """Runs `cmd` in a session of its own; kills the whole session on timeout
    or interruption. Returns the JSON `out` holds afterwards."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failed(f"timed out after {timeout} s: {' '.join(cmd[:8])} ...")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0 or (out and not os.path.exists(out)):
        raise Failed(f"exit {proc.returncode}: {' '.join(cmd[:8])} ...\n{text[-3000:]}")
    if out:
        with open(out) as f:
            return json.load(f)
    return None


class Bench:
    """One layout of fake hosts at one link rate; runs the libraries on it."""

    def __init__(self, hosts, names, per_host, tmp, timeout, sizes, strace_dir=None):
        self.hosts, self.names, self.per_host = hosts, names, per_host
        self.strace_dir = strace_dir
        self.np = len(names) * per_host
        self.tmp, self.timeout, self.sizes = tmp, timeout, sizes
        hosts.ssh_command(tmp)
        # UCX (under MPICH) would find by its boot id that every fake host is
        # one machine and use shared memory, bypassing the shaped link.
        self.env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", UCX_TLS="tcp,self",
                        PATH=tmp + os.pathsep + os.environ["PATH"])
        self.host_list = ",".join(f"{n}:{per_host}" for n in names)
        self.mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")

    def _python(self, lib):
        """The rank's interpreter, under `strace -c -f` with --strace."""
        if not self.strace_dir:
            return [sys.executable]
        target = os.path.join(self.strace_dir, f"strace.{lib}.")
        return ["sh", "-c", f'exec strace -f -c -o {target}$$ "$@"', "sh", sys.executable]

    def _out(self, lib):
        path = os.path.join(self.tmp, f"{lib}.json")
        if os.path.exists(path):
            os.unlink(path)
        return path

    baseline_library = None
    rank_flags = ()  # passed on to every rank (--back-to-back)

    def tfring(self, controller, mode="tfring-core", extra_env=()):
        out = self._out(controller)
        cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(self.np), f"--{controller}",
               "--timeout", str(self.timeout), "-H", self.host_list,
               "--network-interfaces", self.hosts.interfaces(),
               *self._python(mode + "-" + controller), os.path.abspath(__file__),
               "--rank-mode", mode, "--out", out,
               "--sizes", ",".join(self.sizes), *self.rank_flags]
        return run(cmd, dict(self.env, **dict(extra_env)), self.timeout + 60, out)

    def mpich(self):
        out = self._out("mpich")
        cmd = [self.mpiexec, "-n", str(self.np), "-hosts", self.host_list, "-launcher", "ssh",
               "-iface", self.hosts.bridge, *self._python("mpich"), os.path.abspath(__file__),
               "--rank-mode", "mpich", "--out", out, "--sizes", ",".join(self.sizes), *self.rank_flags]
        return run(cmd, self.env, self.timeout, out)

    def gloo(self):
        out = self._out("gloo")
        port = 29500 + os.getpid() % 1000
        procs = []
        try:
            for rank in range(self.np):
                host = self.names[rank // self.per_host]
                env = dict(self.env, MASTER_ADDR=self.hosts.address(self.names[0]),
                           MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(self.np),
                           GLOO_SOCKET_IFNAME=self.hosts.interface(host), OMP_NUM_THREADS="1")
                argv = [*self._python("gloo"), os.path.abspath(__file__), "--rank-mode", "gloo",
                        "--out", out, "--sizes", ",".join(self.sizes), *self.rank_flags]
                procs.append(subprocess.Popen(self.hosts.command(host, argv), cwd=ROOT, env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True, start_new_session=True))
            deadline = time.time() + self.timeout
            texts = []
            for p in procs:
                try:
                    texts.append(p.communicate(timeout=max(1, deadline - time.time()))[0])
                except subprocess.TimeoutExpired:
                    raise Failed(f"gloo timed out after {self.timeout} s")
            if any(p.returncode for p in procs) or not os.path.exists(out):
                raise Failed("gloo failed:\n" + "\n".join(t[-2000:] for t in texts))
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        with open(out) as f:
            return json.load(f)

    def measure(self, lib):
        t0, b0 = time.time(), self.hosts.link_bytes()
        if lib == "tcp":
            data = self.tfring("tcp")
        elif lib == "tcp-tf":
            data = self.tfring("tcp", "tfring-tf")
        elif lib == "tcp-tf-base":
            data = self.tfring("tcp", "tfring-tf", {"TFRING_LIBRARY": self.baseline_library})
        elif lib == "tcp-hier":
            data = self.tfring("tcp", extra_env={"TFRING_HIERARCHICAL_ALLREDUCE": "1"})
        elif lib in ALGORITHMS:
            data = self.tfring("tcp", extra_env={"TFRING_ALLREDUCE_ALGORITHM": ALGORITHMS[lib]})
        elif lib == "mpi":
            data = self.tfring("mpi")
        elif lib == "mpich":
            data = self.mpich()
        else:
            data = self.gloo()
        data["link_bytes"] = self.hosts.link_bytes() - b0
        data["wall_s"] = time.time() - t0
        return data


_PONG = """\
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
b = bytearray(4096)
while True:
    n = 0
    while n < 4096:
        k = c.recv_into(memoryview(b)[n:])
        if not k:
            sys.exit()
        n += k
    c.sendall(b)
"""
_PING = """\
import socket, statistics, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
b = bytearray(4096)
ts = []
for i in range(2000):
    t = time.perf_counter()
    c.sendall(b)
    n = 0
    while n < 4096:
        n += c.recv_into(memoryview(b)[n:])
    ts.append(time.perf_counter() - t)
print(statistics.median(ts[100:]))
"""


def raw_latency(hosts, a, b, port=5401):
    """Half the median round trip of a 4 KB TCP ping-pong from fake host `a`
    to `b` (Python sockets, blocking): one hop's cost without a library."""
    server = subprocess.Popen(hosts.command(b, [sys.executable, "-c", _PONG, hosts.address(b),
                                                str(port)]))
    try:
        time.sleep(0.5)
        out = subprocess.run(hosts.command(a, [sys.executable, "-c", _PING, hosts.address(b),
                                               str(port)]),
                             capture_output=True, text=True, timeout=60)
        return float(out.stdout.strip()) / 2
    finally:
        server.kill()
        server.wait()


def raw_stream(hosts, names):
    one_way, _, tool = transport.raw_stream_bandwidth(hosts, names[0], names[1], seconds=2.0)
    return one_way, tool


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def strace_summary(directory, lib_key, ranks):
    """{syscall: calls per rank} summed over the `strace -c -f` files of
    one library's ranks (then removed)."""
    import glob
    calls = {}
    for path in glob.glob(os.path.join(directory, f"strace.{lib_key}.*")):
        with open(path) as f:
            for line in f:
                fields = line.split()
                # % time, seconds, usecs/call, calls, [errors,] syscall
                if len(fields) >= 5 and fields[3].isdigit() and not fields[-1] == "total":
                    calls[fields[-1]] = calls.get(fields[-1], 0) + int(fields[3]) / ranks
        os.unlink(path)
    return dict(sorted(calls.items(), key=lambda kv: -kv[1]))


STRACE_KEYS = {"tcp": "tfring-core-tcp", "tcp-tf": "tfring-tf-tcp", "tcp-tf-base": "tfring-tf-tcp",
               "tcp-hier": "tfring-core-tcp", "mpi": "tfring-core-mpi", "mpich": "mpich",
               "gloo": "gloo", **{lib: "tfring-core-tcp" for lib in ALGORITHMS}}


def run_layout(rate, layout, libs, rounds, timeout, sizes, strace=False):
    import netns_support
    n_hosts, per_host = (int(v) for v in layout.split("x"))
    names = [f"h{i}" for i in range(n_hosts)]
    libs = [lib for lib in libs if lib != "tcp-hier" or per_host > 1]
    cell = {"rate": rate, "layout": layout, "np": n_hosts * per_host, "load_before": load(),
            "runs": {lib: [] for lib in libs}, "errors": {}}
    with netns_support.FakeHosts(names) as hosts, tempfile.TemporaryDirectory() as tmp:
        if RATE_GBIT[rate] is not None:
            hosts.shape(rate)
            for n in names:
                if len(hosts.shaping(n)) != 2:
                    raise Failed(f"fake host {n} is not shaped: tc shows {hosts.shaping(n)}")
        bench = Bench(hosts, names, per_host, tmp, timeout, sizes, tmp if strace else None)
        raws = [raw_stream(hosts, names)]
        for r in range(rounds):
            order = libs[r % len(libs):] + libs[:r % len(libs)]
            for lib in order:
                try:
                    cell["runs"][lib].append(bench.measure(lib))
                    if strace:
                        cell.setdefault("strace", {})[lib] = strace_summary(
                            tmp, STRACE_KEYS[lib], cell["np"])
                except Failed as e:
                    cell["errors"].setdefault(lib, []).append(str(e))
                    print(f"  {layout} {rate} {lib}: {str(e)[:300]}", file=sys.stderr)
        raws.append(raw_stream(hosts, names))
        cell["raw_4k_one_way_s"] = raw_latency(hosts, names[0], names[1])
    cell["raw_stream_Bps"] = max(r[0] for r in raws)
    cell["raw_before_after_Bps"] = [r[0] for r in raws]
    cell["raw_tool"] = raws[0][1]
    cell["load_after"] = load()
    return cell


def busbw(seconds, nbytes, np_):
    return nbytes / seconds * bc.BUSBW_FACTOR["allreduce"](np_)


def medians(cell, lib):
    """{label: (median time, median cpu)} over the rounds of one library."""
    runs = cell["runs"].get(lib) or []
    if not runs:
        return None
    out = {}
    for label in runs[0]["rows"]:
        out[label] = (statistics.median(r["rows"][label] for r in runs),
                      statistics.median(r["cpu_per_call"][label] for r in runs))
    out["link_bytes"] = statistics.median(r["link_bytes"] for r in runs)
    return out


def table(cells, libs):
    lines = []
    for cell in cells:
        raw = cell["raw_stream_Bps"]
        hop = cell.get("raw_4k_one_way_s")
        hop = f", 4 KB one way (half a ping-pong) {bc.human_time(hop)}" if hop else ""
        lines.append(f"\n### {cell['rate']}, {cell['layout']} (np={cell['np']}); raw one-way "
                     f"stream {raw * 8 / 1e9:.3f} Gbit/s{hop}; load {cell['load_before']} "
                     f"-> {cell['load_after']}\n")
        lines.append("| library | 4 KB latency | 1 MB busbw (Gbit/s, % of raw) | 64 MB busbw "
                     "(Gbit/s, % of raw) | CPU/call 4 KB, 1 MB, 64 MB (ms) | link GB per run |")
        lines.append("|---|---|---|---|---|---|")
        for lib in libs:
            m = medians(cell, lib)
            if m is None:
                if lib in cell["errors"]:
                    lines.append(f"| {LIB_NAMES[lib]} | failed: "
                                 f"{cell['errors'][lib][0].splitlines()[0][:80]} | | | | |")
                continue
            cols = []
            for label in ("1 MB", "64 MB"):
                if label in m:
                    bw = busbw(m[label][0], SIZES[label], cell["np"])
                    cols.append(f"{bw * 8 / 1e9:.3f} ({100 * bw / raw:.0f}%)")
                else:
                    cols.append("-")
            cpu = ", ".join(f"{m[k][1] * 1e3:.2f}" for k in SIZES if k in m)
            lat = bc.human_time(m["4 KB"][0]) if "4 KB" in m else "-"
            lines.append(f"| {LIB_NAMES[lib]} | {lat} | {cols[0]} | {cols[1]} | {cpu} | "
                         f"{m['link_bytes'] / 1e9:.2f} |")
    return "\n".join(lines)


def algorithm_table(cells, libs):
    """Per size, each library's median time, and auto's (tcp) over the
    fastest forced algorithm's: the choice's target is within 10%."""
    shown = [lib for lib in ("tcp-ring", "tcp-rd", "tcp-rab", "tcp", "mpich", "gloo")
             if lib in libs]
    lines = ["\nAllreduce time by algorithm (median of the slowest rank; tfring --tcp = auto):\n",
             "| link, layout | size | " + " | ".join(LIB_NAMES[lib] for lib in shown)
             + " | auto / fastest forced |",
             "|---|---|" + "---|" * len(shown) + "---|"]
    for cell in cells:
        meds = {lib: medians(cell, lib) for lib in shown}
        for label in cell_sizes(cell):
            row = [f"{cell['rate']}, {cell['layout']}", label]
            for lib in shown:
                m = meds[lib]
                row.append(bc.human_time(m[label][0]) if m and label in m else "-")
            forced = [meds[lib][label][0] for lib in ALGORITHMS if meds.get(lib)
                      and label in meds[lib]]
            auto = meds.get("tcp")
            row.append(f"{auto[label][0] / min(forced):.2f}" if forced and auto and label in auto
                       else "-")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def strace_table(cell, libs):
    """System calls per rank and per call of the last size measured."""
    calls = transport.reps_for(SIZES[cell_sizes(cell)[-1]]) + 3
    lines = [f"\nSystem calls per rank per call ({cell_sizes(cell)[-1]}, strace -c -f; the "
             "whole run divided by its calls of that size):\n",
             "| library | top system calls |", "|---|---|"]
    for lib in libs:
        top = list((cell.get("strace") or {}).get(lib, {}).items())[:8]
        lines.append(f"| {LIB_NAMES[lib]} | " + ", ".join(f"{name} {n / calls:.0f}"
                                                         for name, n in top) + " |")
    return "\n".join(lines)


def cell_sizes(cell):
    for runs in cell["runs"].values():
        if runs:
            return list(runs[0]["rows"])
    return list(SIZES)


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1gbit, 2x1, one round, 4 KB and 1 MB and 64 MB")
    p.add_argument("--rates", default="1gbit,2500mbit,5gbit,unlimited")
    p.add_argument("--layouts", default="2x1,3x1,4x1,2x2")
    p.add_argument("--libs", default=",".join(LIBS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--timeout", type=int, default=240, help="seconds per launch")
    p.add_argument("--strace", action="store_true",
                   help="run every rank under `strace -c -f` and report its system calls "
                        "(slows everything: for where the time goes, not for timings)")
    p.add_argument("--baseline-library", metavar="SO",
                   help="adds a row tcp-tf-base: the TF op with TFRING_LIBRARY=SO (another "
                        "build, e.g. main's), for before/after in the same run")
    p.add_argument("--back-to-back", action="store_true",
                   help="time each call right after the one before it, not after a line-up "
                        "(see _timed_rows: the fair measure for comparing algorithms)")
    p.add_argument("--json")
    p.add_argument("--md", help="append the tables to this markdown file")
    p.add_argument("--rank-mode", choices=("tfring-core", "tfring-tf", "mpich", "gloo"),
                   help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = [s.strip() for s in args.sizes.split(",")]
    if args.rank_mode:
        return {"mpich": mpich_rank, "gloo": gloo_rank}.get(args.rank_mode, tfring_rank)(args)
    import netns_support
    if not netns_support.available():
        sys.exit("cross_host.py needs root and network namespaces (ip netns)")
    if args.quick:
        args.rates, args.layouts, args.rounds = "1gbit", "2x1", 1
    # SIGTERM unwinds like Ctrl-C, through every FakeHosts' clean-up.
    signal.signal(signal.SIGTERM, _interrupted)
    libs = [lib for lib in args.libs.split(",") if lib]
    if args.back_to_back:
        Bench.rank_flags = ("--back-to-back",)
    if args.baseline_library:
        Bench.baseline_library = os.path.abspath(args.baseline_library)
        libs.append("tcp-tf-base")
    cells = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for rate in args.rates.split(","):
        for layout in args.layouts.split(","):
            print(f"{rate} {layout} (load {load()})", file=sys.stderr, flush=True)
            cells.append(run_layout(rate, layout, libs, args.rounds, args.timeout, args.sizes,
                                    args.strace))
            print(table(cells[-1:], libs), flush=True)
            if any(lib in ALGORITHMS for lib in libs):
                print(algorithm_table(cells[-1:], libs), flush=True)
            if args.strace:
                print(strace_table(cells[-1], libs), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"started": started, "argv": sys.argv, "cells": cells}, f, indent=1)
    if args.md:
        with open(args.md, "a") as f:
            f.write(f"\n## Run of {started}\n\n`python {' '.join(sys.argv)}` "
                    f"(nproc {os.cpu_count()}, load at the end {load()})\n")
            f.write(table(cells, libs) + "\n")
            if any(lib in ALGORITHMS for lib in libs):
                f.write(algorithm_table(cells, libs) + "\n")
    failed = sum(len(c["errors"]) for c in cells)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit("cross_host.py: interrupted; fake hosts and their processes removed")
