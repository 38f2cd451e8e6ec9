"""The TCP transport against MPI, in one run (issue 9's benchmark).

    python benchmarks/transport.py [--np 2,3] [--json out.json] [--skip-cross-host]
                                   [--skip-same-host] [--sizes "4 KB,1 MB,64 MB"] [--rounds N]
    python benchmarks/transport.py --cpp-ring ROUNDS [--np 2,3]   (the transport alone)
    python benchmarks/transport.py --cpp-negotiate ROUNDS [--np 2,3] [--core DIR]

Rows, each measured for both controllers (tfringrun --mpi and --tcp)
launched one after the other in the same run (with --rounds N, N times, the
order alternating, and each cell the median over rounds; the process CPU
per call is printed next to the time, since other jobs' load moves it less):
  * 4 KB allreduce latency: the median time of one float32 allreduce inside
    tf.function, ranks lined up by a tiny allreduce before each call, the
    slowest rank's median;
  * 1 MB and 64 MB allreduce busbw (same host; nccl-tests definitions:
    algbw = bytes / time, busbw = algbw * 2(n-1)/n);
  * idle CPU per rank: process CPU-seconds per second over a few seconds of
    sleep after some collectives (target <= 0.02).
Then, with fake hosts that have network stacks of their own (network
namespaces joined by a bridge: tests/netns_support.py; needs root), the
cross-host ring over TCP (one rank per fake host, TFRING_CPU_OPERATIONS=ring)
against the bandwidth of one raw TCP stream between two of those fake hosts,
measured in the same run by `iperf3` when installed, else by a Python
sendall/recv_into loop, and of two raw streams at once, one each way (what a
ring's neighbours do: every rank sends and receives at the same time; on a
few cores the two directions share the CPU that copies every byte through
the kernel), each measured just before and just after the ring and the
higher of the two kept. Target: the ring's busbw >= 90% of the one-way stream.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import bench_common as bc  # noqa: E402

SIZES = {"4 KB": 4 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20}


def reps_for(nbytes):
    return 200 if nbytes <= (64 << 10) else 30 if nbytes <= (4 << 20) else 7


def rank_main(args):
    """Runs inside every rank; rank 0 writes the results as JSON."""
    import numpy as np
    import tensorflow as tf

    import tfring.tensorflow as hvd

    hvd.init()
    size = hvd.size()
    one = tf.ones([1], tf.float32)

    @tf.function
    def step(x):
        return hvd.allreduce(x, op=hvd.Sum, name="bench")

    @tf.function
    def line_up(x):
        return hvd.allreduce(x, op=hvd.Sum, name="line_up")

    def slowest(value):
        return float(hvd.allgather(tf.constant([value], tf.float64)).numpy().max())

    results = {"controller": "tcp" if hvd.gloo_enabled() else "mpi", "np": size, "rows": {}}
    for label in args.sizes:
        nbytes = SIZES[label]
        x = tf.ones([nbytes // 4], tf.float32)
        out = step(x).numpy()
        assert out[0] == size and out[-1] == size, "wrong allreduce result"
        times = []
        cpu = 0.0
        for i in range(reps_for(nbytes) + 3):
            if i == 3:
                cpu = bc.rusage_cpu()
            line_up(one).numpy()
            t0 = time.perf_counter()
            step(x).numpy()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        cpu = (bc.rusage_cpu() - cpu) / len(times)
        results["rows"][label] = slowest(float(np.median(times)))
        # Process CPU per call (with its line-up allreduce), which the load
        # of other jobs moves less than time.
        results.setdefault("cpu_per_call", {})[label] = slowest(cpu)
    # Idle cost: after the collectives, every thread (the background loop,
    # heartbeats) is as it will be between training steps.
    line_up(one).numpy()
    cpu0, t0 = bc.rusage_cpu(), time.perf_counter()
    time.sleep(args.idle_seconds)
    idle = (bc.rusage_cpu() - cpu0) / (time.perf_counter() - t0)
    results["idle_cpu"] = slowest(idle)
    if hvd.rank() == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)
    hvd.shutdown()


def launch(np_, controller, sizes, timeout, extra=(), env=None, idle_seconds=3.0):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_), f"--{controller}",
           "--timeout", str(timeout), *extra, sys.executable, os.path.abspath(__file__),
           "--rank-mode", "--out", out, "--sizes", ",".join(sizes),
           "--idle-seconds", str(idle_seconds)]
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout + 60)
    if proc.returncode != 0:
        sys.exit(f"benchmark launch failed ({controller}, np={np_}):\n{proc.stdout[-5000:]}")
    with open(out) as f:
        data = json.load(f)
    os.unlink(out)
    return data


_RECEIVER = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
             "socket.SO_REUSEADDR,1);s.bind((sys.argv[1],int(sys.argv[2])));s.listen()\n"
             "c,_=s.accept();b=bytearray(1<<22);v=memoryview(b)\n"
             "while c.recv_into(v):pass\n")
_SENDER = ("import socket,sys,time\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])))"
           "\nb=b'x'*(1<<22);n=0;t=time.perf_counter();end=t+float(sys.argv[3])\n"
           "while time.perf_counter()<end:\n c.sendall(b);n+=len(b)\n"
           "print(n/(time.perf_counter()-t))\n")


def _python_streams(hosts, pairs, seconds):
    """Bytes/s of each (sender, receiver) stream, all running at once."""
    port = 5201
    receivers = [subprocess.Popen(hosts.command(b, [sys.executable, "-c", _RECEIVER,
                                                    hosts.address(b), str(port + i)]))
                 for i, (_, b) in enumerate(pairs)]
    time.sleep(0.5)
    senders = [subprocess.Popen(hosts.command(a, [sys.executable, "-c", _SENDER, hosts.address(b),
                                                  str(port + i), str(seconds)]),
                                stdout=subprocess.PIPE, text=True)
               for i, (a, b) in enumerate(pairs)]
    rates = [float(p.communicate(timeout=seconds + 30)[0].strip()) for p in senders]
    for r in receivers:
        r.wait(timeout=10)
    return rates


def raw_stream_bandwidth(hosts, a, b, seconds=3.0):
    """Bytes/s of one TCP stream from fake host `a` to fake host `b` (iperf3
    when installed, else a Python sendall/recv_into loop), and of each
    direction when both run at once, as a ring's neighbours send (Python)."""
    one_way, tool = None, "python socket loop"
    if subprocess.run(["which", "iperf3"], capture_output=True).returncode == 0:
        port = 5301
        server = subprocess.Popen(hosts.command(b, ["iperf3", "-s", "-1", "-p", str(port)]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        out = subprocess.run(hosts.command(a, ["iperf3", "-c", hosts.address(b), "-p", str(port),
                                                "-t", str(int(seconds)), "-J"]),
                             capture_output=True, text=True, timeout=seconds + 30)
        server.wait(timeout=10)
        one_way = json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8
        tool = "iperf3"
    if one_way is None:
        one_way = _python_streams(hosts, [(a, b)], seconds)[0]
    both = _python_streams(hosts, [(a, b), (b, a)], seconds)
    return one_way, sum(both) / len(both), tool


def cross_host(np_, timeout):
    """Ring busbw over TCP across np_ fake hosts, and the raw stream baseline."""
    import netns_support
    if not netns_support.available():
        return None
    names = [f"h{i}" for i in range(np_)]
    with netns_support.FakeHosts(names) as hosts, tempfile.TemporaryDirectory() as tmp:
        hosts.ssh_command(tmp)
        env = {"PATH": tmp + os.pathsep + os.environ["PATH"], "TFRING_CPU_OPERATIONS": "ring",
               "TFRING_CROSS_HOST_MIN_BYTES": "0"}
        extra = ["-H", ",".join(f"{n}:1" for n in names), "--network-interfaces",
                 hosts.interfaces()]
        # The baseline before and after the ring: on a shared machine the
        # load changes within a minute, and the higher of the two (the
        # stricter ceiling) is what the ring is held to.
        raw0, both0, tool = raw_stream_bandwidth(hosts, names[0], names[1])
        data = launch(np_, "tcp", ["64 MB"], timeout, extra=extra, env=env, idle_seconds=0.5)
        raw1, both1, tool = raw_stream_bandwidth(hosts, names[0], names[1])
    t = data["rows"]["64 MB"]
    busbw = (64 << 20) / t * 2 * (np_ - 1) / np_
    return {"np": np_, "ring_busbw": busbw, "raw_stream": max(raw0, raw1),
            "raw_each_way_both": max(both0, both1), "raw_before_after": [raw0, raw1],
            "raw_each_way_before_after": [both0, both1], "tool": tool, "median_s": t}


CORE = os.path.join(ROOT, "tf_ops", "common")
CPP_RING_SOURCES = ["tests/bench/tcp_ring_bench.cc", "ops/ring_data_plane.cc",
                    "ops/ring_pipeline.cc", "ops/allreduce_algorithms.cc",
                    "ops/comm_point_to_point.cc", "ops/adasum.cc", "reduction.cc", "common.cc",
                    "logging.cc", "peer_monitor.cc", "config.cc", "transport/communicator.cc",
                    "transport/tcp/tcp_communicator.cc", "transport/tcp/handshake.cc",
                    "transport/tcp/mesh.cc", "transport/tcp/world.cc", "transport/tcp/liveness.cc",
                    "transport/tcp/peer_frame.cc",
                    "transport/tcp/socket.cc", "transport/tcp/wire.cc", "transport/tcp/sha256.cc",
                    "transport/tcp/rendezvous_client.cc"]


def build_cpp(tmp, core=CORE):
    """Builds tcp_ring_bench (this tree's driver) against the core sources in
    `core` (another tree's tf_ops/common, to compare with old code in the
    same run)."""
    binary = os.path.join(tmp, "tcp_ring_bench")
    cxx = os.environ.get("CXX", "g++").split()
    sources = [os.path.join(CORE, CPP_RING_SOURCES[0])]
    # A tree from before the TCP communicator or the ring plane was split by
    # concern (compared in the same run) lacks some of these files.
    sources += [os.path.join(core, f) for f in CPP_RING_SOURCES[1:]
                if os.path.exists(os.path.join(core, f))]
    subprocess.run([*cxx, "-std=c++17", "-O2", "-pthread", "-I", core, "-o", binary, *sources],
                   check=True, timeout=900)
    return binary


def cpp_negotiate(nps, rounds, reps, timeout, core=CORE, payload=256):
    """The TCP controller's negotiation rounds on one host (loopback), no
    TensorFlow: tcp_ring_bench's "negotiate" mode. Per np and round, the
    slowest rank's median and p90 of a cache-hit round (the bit allreduce)
    and of a cache-miss round (bits, gather, broadcast), in microseconds."""
    from tfring.runner import wire
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_cpp(tmp, core)
        env = dict(os.environ, TFRING_SECRET=wire.encode_secret(wire.generate_secret()))
        for np_ in nps:
            for _ in range(rounds):
                with tempfile.TemporaryDirectory() as d:
                    procs = [subprocess.Popen([binary, str(r), str(np_), d, "127.0.0.1",
                                               str(payload), str(reps), "negotiate"],
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True, env=env) for r in range(np_)]
                    try:
                        lines = [p.communicate(timeout=timeout)[0] for p in procs]
                    finally:
                        for p in procs:
                            if p.poll() is None:
                                p.kill()
                                p.wait()
                ranks = [dict(zip(line.split()[2::2], map(float, line.split()[3::2])))
                         for text in lines for line in text.splitlines()
                         if line.startswith("NEGOTIATE ")]
                if len(ranks) != np_:
                    sys.exit("tcp_ring_bench negotiate failed:\n" + "".join(lines))
                row = {"np": np_, "load": os.getloadavg()[0], "core": core}
                for k in ("bits_median_us", "bits_p90_us", "miss_median_us", "miss_p90_us"):
                    row[k] = max(r[k] for r in ranks)
                row["cpu_us_per_round"] = sum(r["cpu_us_per_round"] for r in ranks) / np_
                print(f"{np_:>2} negotiation over TCP (C++, {core}): cache hit median "
                      f"{row['bits_median_us']:.1f} us (p90 {row['bits_p90_us']:.1f}), miss "
                      f"{row['miss_median_us']:.1f} us (p90 {row['miss_p90_us']:.1f}), CPU "
                      f"{row['cpu_us_per_round']:.1f} us per round pair per rank "
                      f"(load {row['load']:.1f})", flush=True)
                out.append(row)
    return out


def cpp_ring(nps, rounds, reps, timeout, core=CORE):
    """The ring plane over the TCP communicator alone (no TensorFlow, no
    negotiation: tf_ops/common/tests/bench/tcp_ring_bench.cc, built with -O2), one
    rank per fake host, 64 MB float32 allreduce: the slowest rank's median
    time and each rank's CPU time per allreduce, `rounds` times per np."""
    import netns_support
    from tfring.runner import wire
    if not netns_support.available():
        sys.exit("--cpp-ring needs fake hosts (root and ip netns)")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        binary = build_cpp(tmp, core)
        env = dict(os.environ, TFRING_SECRET=wire.encode_secret(wire.generate_secret()))
        for np_ in nps:
            names = [f"h{i}" for i in range(np_)]
            with netns_support.FakeHosts(names) as hosts:
                # The physical baselines in the same window: one raw stream,
                # and a raw stream each way at once (what a ring rank does).
                raw = [raw_stream_bandwidth(hosts, names[0], names[1])[:2]]
                for _ in range(rounds):
                    with tempfile.TemporaryDirectory() as d:
                        procs = [subprocess.Popen(
                            hosts.command(h, [binary, str(r), str(np_), d, hosts.address(h),
                                              str(64 << 20), str(reps)]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env) for r, h in enumerate(names)]
                        lines = [p.communicate(timeout=timeout)[0] for p in procs]
                    ranks = [dict(zip(line.split()[2::2], map(float, line.split()[3::2])))
                             for text in lines for line in text.splitlines()
                             if line.startswith("RANK ")]
                    if len(ranks) != np_:
                        sys.exit("tcp_ring_bench failed:\n" + "".join(lines))
                    worst = max(r["median_ms"] for r in ranks)
                    row = {"np": np_, "median_ms": worst,
                           "busbw_gbs": (64 << 20) / (worst / 1e3) * 2 * (np_ - 1) / np_ / 1e9,
                           "cpu_ms_per_op": sum(r["cpu_ms_per_op"] for r in ranks) / np_,
                           "load": os.getloadavg()[0]}
                    print(f"{np_:>2} ring over TCP (C++), 64 MB: median {worst:8.1f} ms, busbw "
                          f"{row['busbw_gbs']:.2f} GB/s, CPU per allreduce per rank "
                          f"{row['cpu_ms_per_op']:.1f} ms (load {row['load']:.1f})", flush=True)
                    out.append(row)
                raw.append(raw_stream_bandwidth(hosts, names[0], names[1])[:2])
                one, both = max(r[0] for r in raw), max(r[1] for r in raw)
                print(f"{np_:>2} raw TCP between two fake hosts (higher of before/after): one "
                      f"stream {one / 1e9:.2f} GB/s, each way at once {both / 1e9:.2f} GB/s; "
                      f"best ring busbw = {max(r['busbw_gbs'] for r in out if r['np'] == np_) * 1e9 / one:.0%} "
                      f"of one stream, "
                      f"{max(r['busbw_gbs'] for r in out if r['np'] == np_) * 1e9 / both:.0%} of each way at once",
                      flush=True)
                for r in out:
                    if r["np"] == np_:
                        r["raw_stream"], r["raw_each_way_both"] = one, both
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", default="2,3")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--skip-cross-host", action="store_true")
    p.add_argument("--skip-same-host", action="store_true")
    p.add_argument("--cpp-ring", type=int, metavar="ROUNDS", default=0,
                   help="only run the C++ ring-over-TCP driver across fake hosts, ROUNDS times")
    p.add_argument("--cpp-negotiate", type=int, metavar="ROUNDS", default=0,
                   help="only time the TCP negotiation rounds (C++, one host), ROUNDS times")
    p.add_argument("--core", default=CORE,
                   help="with --cpp-ring/--cpp-negotiate: build the core from this "
                        "tf_ops/common (e.g. another tree's) to compare in one run")
    p.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=1,
                   help="same-host rounds, the controllers' order alternating (MPI first "
                        "in odd rounds, TCP first in even ones); cells are medians")
    p.add_argument("--sizes", default=",".join(SIZES),
                   help="same-host rows to run (comma-separated, default all)")
    p.add_argument("--idle-seconds", type=float, default=3.0, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = [x.strip() for x in args.sizes.split(",")]
    unknown = [x for x in args.sizes if x not in SIZES]
    if unknown:
        p.error(f"--sizes: unknown {unknown}; choose from {list(SIZES)}")
    if args.rank_mode:
        return rank_main(args)

    machine = {"load_before": os.getloadavg(), "cpus": os.cpu_count(), "when": bc.now_iso(),
               "host": socket.gethostname()}
    if args.cpp_negotiate:
        rows = cpp_negotiate([int(n) for n in args.np.split(",")], args.cpp_negotiate, 2000,
                             args.timeout, core=os.path.abspath(args.core))
        machine["load_after"] = os.getloadavg()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine, "cpp_negotiate": rows}, f, indent=1)
        return
    if args.cpp_ring:
        rows = cpp_ring([int(n) for n in args.np.split(",")], args.cpp_ring, 15, args.timeout,
                        core=os.path.abspath(args.core))
        machine["load_after"] = os.getloadavg()
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine, "cpp_ring": rows}, f, indent=1)
        return
    same_host = []
    for round_ in range(args.rounds if not args.skip_same_host else 0):
        # Odd rounds start with TCP: whichever runs second at an np finds the
        # machine as the first left it (memory, caches), so one fixed order
        # would favour one controller on every row.
        order = ("mpi", "tcp") if round_ % 2 == 0 else ("tcp", "mpi")
        for np_ in (int(n) for n in args.np.split(",")):
            for controller in order:
                print(f"round {round_ + 1}: running np={np_} --{controller} ...",
                      file=sys.stderr, flush=True)
                data = launch(np_, controller, args.sizes, args.timeout)
                data["round"] = round_ + 1
                data["load_after"] = os.getloadavg()[0]
                same_host.append(data)
    cross = []
    if not args.skip_cross_host:
        for np_ in (int(n) for n in args.np.split(",")):
            print(f"running the cross-host ring, np={np_} ...", file=sys.stderr, flush=True)
            r = cross_host(np_, args.timeout)
            if r is None:
                print("fake hosts unavailable (needs root and ip netns): skipped",
                      file=sys.stderr)
                break
            cross.append(r)
    machine["load_after"] = os.getloadavg()

    print(f"\nmachine: {machine}\n")
    rounds = sorted({r["round"] for r in same_host})
    if len(rounds) > 1:
        print(f"{len(rounds)} rounds, the controllers' order alternated; each cell is the "
              "median over rounds, then every round's TCP-vs-MPI ratio\n")
    print(f"{'np':>2} {'row':<22} {'MPI':>12} {'TCP':>12} {'TCP vs MPI':>11}  "
          f"{'CPU/call MPI, TCP (ms)':>23}")
    for np_ in sorted({r["np"] for r in same_host}):
        runs = {c: [r for r in same_host if r["np"] == np_ and r["controller"] == c]
                for c in ("mpi", "tcp")}
        for label, nbytes in SIZES.items():
            if label not in runs["mpi"][0]["rows"]:
                continue
            ms = [r["rows"][label] for r in runs["mpi"]]
            ts = [r["rows"][label] for r in runs["tcp"]]
            m, t = statistics.median(ms), statistics.median(ts)
            cm = statistics.median([r["cpu_per_call"][label] for r in runs["mpi"]]) * 1e3
            ct = statistics.median([r["cpu_per_call"][label] for r in runs["tcp"]]) * 1e3
            per_round = ("  rounds: " + " ".join(f"{a / b:.2f}x" for a, b in zip(ms, ts))
                         if len(ms) > 1 else "")
            if label == "4 KB":
                print(f"{np_:>2} {'4 KB latency (us)':<22} {m * 1e6:>12.1f} {t * 1e6:>12.1f} "
                      f"{m / t:>10.2f}x  {cm:>11.3f} {ct:>11.3f}{per_round}")
            else:
                bus = lambda s: nbytes / s * 2 * (np_ - 1) / np_ / 1e9  # noqa: E731
                print(f"{np_:>2} {label + ' busbw (GB/s)':<22} {bus(m):>12.2f} {bus(t):>12.2f} "
                      f"{m / t:>10.2f}x  {cm:>11.3f} {ct:>11.3f}{per_round}")
        print(f"{np_:>2} {'idle CPU (CPU-s/s)':<22} "
              f"{max(r['idle_cpu'] for r in runs['mpi']):>12.4f} "
              f"{max(r['idle_cpu'] for r in runs['tcp']):>12.4f}  (highest over rounds)")
    for r in cross:
        print(f"{r['np']:>2} cross-host ring over TCP, 64 MB: busbw {r['ring_busbw'] / 1e9:.2f} GB/s"
              f" = {r['ring_busbw'] / r['raw_stream']:.0%} of one raw stream ({r['tool']}, "
              f"{r['raw_stream'] / 1e9:.2f} GB/s), {r['ring_busbw'] / r['raw_each_way_both']:.0%} "
              f"of a raw stream each way at once ({r['raw_each_way_both'] / 1e9:.2f} GB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "same_host": same_host, "cross_host": cross}, f,
                      indent=1)


if __name__ == "__main__":
    main()
