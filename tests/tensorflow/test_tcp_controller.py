"""tfring.tensorflow over the TCP controller, end to end: under
``tfringrun --tcp``, and in ranks that no launcher started (plain processes
with the rendezvous variables, as Ray, Spark or Kubernetes would start them).
No rank may initialise MPI.

Skipped only while the op library has no ``init_tcp`` (the C++ TCP
controller); every other failure fails.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from support import ROOT, rank_lines, tfringrun
from tfring.runner import start_rendezvous, wire

# Every rank: init over TCP, check its place, allreduce, and prove MPI was
# never initialised, nor even imported.
RANK = textwrap.dedent("""
    import os, sys
    import tensorflow as tf
    import tfring.tensorflow as hvd
    hvd.init()
    assert hvd.gloo_enabled() and not hvd.mpi_enabled()
    r, n = hvd.rank(), hvd.size()
    assert n == int(os.environ["TFRING_SIZE"]), n
    if "TFRING_RANK" in os.environ:
        assert r == int(os.environ["TFRING_RANK"]), r
    total = hvd.allreduce(tf.constant([float(r + 1), 1.0]), op=hvd.Sum)
    assert total.numpy().tolist() == [n * (n + 1) / 2, float(n)], total
    gathered = hvd.allgather(tf.constant([r]))
    assert gathered.numpy().tolist() == list(range(n)), gathered
    hvd.shutdown()
    assert "mpi4py" not in sys.modules, "mpi4py was imported"
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    assert not MPI.Is_initialized(), "MPI was initialised"
    print("OK", r, n, flush=True)
""")


@pytest.mark.parametrize("num_proc", [2, 3])
def test_tfringrun_tcp_job(num_proc):
    result = tfringrun(num_proc, [sys.executable, "-c", RANK], timeout=300, extra=("--tcp",))
    assert result.returncode == 0, result.stdout[-10000:]
    assert sorted(text for _, text in rank_lines(result.stdout) if text.startswith("OK")) == [
        f"OK {r} {num_proc}" for r in range(num_proc)]


@pytest.mark.parametrize("serve", ["store-from-tfring.runner", "rank-0-serves"])
@pytest.mark.parametrize("num_proc", [2, 3])
def test_ranks_without_a_launcher(num_proc, serve):
    # No TFRING_CONTROLLER: TFRING_RENDEZVOUS_ADDR alone selects tcp.
    secret = wire.generate_secret()
    server = None
    if serve == "rank-0-serves":
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        server, _, port = start_rendezvous("127.0.0.1", 0, secret)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFRING_", "HOROVOD_", "PMI_", "OMPI_", "PMIX_"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TFRING_RENDEZVOUS_ADDR="127.0.0.1",
               TFRING_RENDEZVOUS_PORT=str(port), TFRING_SECRET=wire.encode_secret(secret),
               TFRING_SIZE=str(num_proc), PYTHONPATH=os.environ.get("PYTHONPATH", ROOT))
    procs = []
    try:
        for slot in range(num_proc):
            extra = {"TFRING_RENDEZVOUS_SERVE": "1"} if serve == "rank-0-serves" and slot == 0 \
                else {}
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RANK], cwd=ROOT, env=dict(env, TFRING_LOCAL_SLOT=str(slot),
                                                                 **extra),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if server is not None:
            server.stop()
    for slot, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {slot}:\n{out[-6000:]}"
    oks = sorted(line for out in outputs for line in out.splitlines() if line.startswith("OK"))
    assert oks == [f"OK {r} {num_proc}" for r in range(num_proc)]
