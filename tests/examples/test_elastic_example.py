"""examples/keras_elastic_digits.py under tfringrun's elastic driver, with
one of three workers SIGKILLed from outside while it trains."""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic_support import ElasticJob, leftovers, worker_pids  # noqa: E402


def test_keras_elastic_digits_survives_a_worker_killed_from_outside(tmp_path):
    command = [sys.executable, "examples/keras_elastic_digits.py", "--epochs", "6"]
    with ElasticJob(tmp_path, "localhost:3", command, 3, 2, 3, timeout=300) as job:
        job.wait_for(r"epoch 2/6 size 3", timeout=240)
        pids = worker_pids(job)
        assert sorted(pids) == [0, 1, 2], pids
        os.kill(pids[1], signal.SIGKILL)
        code, output = job.finish()
    assert code == 0, output[-8000:]
    assert "worker 1 (on localhost, rank 1) was killed by signal 9 (SIGKILL); lost" in output
    assert re.search(r"re-formed: size 2, resuming at epoch [1-5] batch \d+", output), output
    assert re.search(r"epoch 6/6 size 2", output), output[-4000:]
    accuracy = float(re.search(r"val_accuracy=([\d.]+)", output).group(1))
    assert accuracy >= 0.9, output[-4000:]
    assert leftovers(job) == []
