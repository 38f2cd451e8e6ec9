"""Elastic training's recovery and join times (issue 11's benchmark).

    python benchmarks/elastic.py [--before 50,500] [--json out.json]

For each number K of steps trained before the event, on localhost with a
tiny Keras model and hvd.elastic.run (a commit after every step):

* recovery, np=3 -> 2: worker 2 SIGKILLs itself before step K; the time
  from its death (the wall-clock time it wrote just before) to the first
  step that rank 0 completes after the job re-formed at size 2. It includes
  the failure detection (the closed connection or the heartbeat), the
  rollback, the driver's new round, the TCP start-up and the broadcast.
* join, np=2 -> 3: once rank 0 completed step K, the discovery file is
  rewritten from localhost:2 to localhost:3; the time from that rewrite to
  the first step that rank 0 completes at size 3. It includes up to one
  discovery interval (1 s), starting the new worker's Python and
  TensorFlow, the round and the broadcast of the state. The part after the
  driver published the round (the new worker is up and asked to join) is
  shown apart: the rest is the new process's start, mostly importing
  TensorFlow.

Targets: recovery <= 10 s, join <= 15 s, and neither grows with K.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worker():
    """One elastic worker: prints STEP step size wall-time on rank 0."""
    import numpy as np
    import tensorflow as tf
    import tfring.tensorflow as hvd
    hvd.init()
    kill_at = int(os.environ.get("BENCH_KILL_STEP", "-1"))
    steps = int(os.environ["BENCH_STEPS"])
    wid = os.environ["TFRING_ELASTIC_WORKER"]
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, "relu"),
                                 tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    x = np.random.RandomState(0).normal(size=(64, 32)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    state = hvd.elastic.TensorFlowKerasState(model, opt, step=0)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        grads = [hvd.allreduce(g) for g in tape.gradient(loss, model.trainable_variables)]
        opt.apply_gradients(zip(grads, model.trainable_variables))

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if wid == "2" and state.step == kill_at:
                print("DEATH", f"{time.time():.6f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            step(x, y)
            if hvd.rank() == 0:
                print("STEP", state.step, hvd.size(), f"{time.time():.6f}", flush=True)
            state.step += 1
            state.commit()

    train(state)


def run_job(hosts_file, np_, env, on_line, timeout=600):
    """Runs an elastic job (max 3 workers) and feeds each output line to
    `on_line`; when it returns True, the job is stopped (SIGTERM to
    tfringrun, which stops every worker). Returns (exit code, lines)."""
    cmd = [sys.executable, "-m", "tfring.runner.launch", "-np", str(np_), "--min-np", "2",
           "--max-np", "3", "--host-discovery-script", f"cat {hosts_file}",
           "--timeout", str(timeout), "--verbose", sys.executable, os.path.abspath(__file__),
           "--worker"]
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if on_line(lines[-1]):
                proc.send_signal(signal.SIGTERM)
                break
        proc.wait(timeout + 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, lines


_STEP = re.compile(r"STEP (\d+) (\d+) ([\d.]+)")
_DEATH = re.compile(r"DEATH ([\d.]+)")


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".tmp", path)


def recovery(tmp, before):
    hosts = os.path.join(tmp, "hosts")
    _write(hosts, "localhost:3")
    code, lines = run_job(hosts, 3, {"BENCH_KILL_STEP": str(before),
                                     "BENCH_STEPS": str(before + 20)}, lambda _: False)
    if code != 0:
        raise RuntimeError("recovery job failed:\n" + "\n".join(lines[-40:]))
    death = next(float(m.group(1)) for m in map(_DEATH.search, lines) if m)
    after = [float(m.group(3)) for m in map(_STEP.search, lines)
             if m and int(m.group(2)) == 2 and float(m.group(3)) > death]
    return after[0] - death


def join(tmp, before):
    hosts = os.path.join(tmp, "hosts")
    _write(hosts, "localhost:2")
    changed, grown, formed = [], [], []

    def on_line(line):
        if changed and not formed and "tfringrun: round 2:" in line:
            formed.append(time.time())
        m = _STEP.search(line)
        if not m:
            return False
        if not changed and int(m.group(1)) >= before:
            _write(hosts, "localhost:3")
            changed.append(time.time())
        if int(m.group(2)) == 3:
            grown.append(float(m.group(3)))
        return len(grown) >= 3

    # The job trains on until it is stopped, a few steps after it grew.
    _, lines = run_job(hosts, 2, {"BENCH_STEPS": "1000000000"}, on_line)
    if not grown:
        raise RuntimeError("the job never grew to 3:\n" + "\n".join(lines[-40:]))
    return grown[0] - changed[0], grown[0] - formed[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="50,500",
                        help="steps trained before the event, comma-separated")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for before in [int(b) for b in args.before.split(",")]:
            for _ in range(args.repeat):
                load = os.getloadavg()[0]
                rec = recovery(tmp, before)
                jn, reform = join(tmp, before)
                rows.append({"steps_before": before, "recovery_s": rec, "join_s": jn,
                             "join_after_round_s": reform, "load1": load})
                print(f"steps before {before:5d}: recovery {rec:6.2f} s  join {jn:6.2f} s "
                      f"(of which {reform:5.2f} s after the driver published the round) "
                      f"(load average {load:.1f} on {os.cpu_count()} CPUs)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
