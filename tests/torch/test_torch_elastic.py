"""Elastic tfring.torch: a worker SIGKILLed mid-epoch; the survivors roll
back to the last commit, re-form at size 2, share the epoch's remaining
samples (each sample of each epoch trained on once) and end with identical
weights."""
import json
import os
import sys
from collections import Counter

from elastic_support import ElasticJob, leftovers, rank_lines

WORKER = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "torch_elastic_worker.py")]
EPOCHS, ROWS = 3, 48


def _fields(output, word):
    return [(w, text.split()[1:]) for w, text in rank_lines(output)
            if text.split()[:1] == [word]]


def test_training_survives_a_killed_worker(tmp_path, torch_ready):
    with ElasticJob(tmp_path, "localhost:3", WORKER, 3, 2, 3,
                    env={"ELASTIC_KILL": "2:1:2"}) as job:
        code, output = job.finish()
    assert code == 0, output[-8000:]
    resets = _fields(output, "RESET")
    assert len(resets) == 2 and {tuple(f) for _, f in resets} == {("1", "24", "2")}, resets
    seen = {e: Counter() for e in range(EPOCHS)}
    for _, (epoch, _size, idx) in _fields(output, "SEEN"):
        seen[int(epoch)].update(int(i) for i in idx.split(","))
    for epoch, counts in seen.items():
        assert counts == Counter(range(ROWS)), (epoch, counts)
    finals = [json.loads(" ".join(f[1:])) for _, f in _fields(output, "FINAL")]
    assert len(finals) == 2 and finals[0] == finals[1], output[-8000:]
    assert leftovers(job) == []
