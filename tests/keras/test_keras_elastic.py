"""Elastic Keras model.fit (issue 11): KerasState and the three callbacks,
a worker SIGKILLed mid-fit, epoch and batch resuming at the last commit,
and the traced train function following the new size."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic_support import ElasticJob, leftovers, rank_lines  # noqa: E402

WORKER = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "elastic_keras_worker.py")]
EPOCHS, STEPS = 3, 6


def _fields(output, word):
    return [(w, text.split()[1:]) for w, text in rank_lines(output)
            if text.split()[:1] == [word]]


def test_fit_survives_a_killed_worker_and_resumes_at_the_commit(tmp_path):
    with ElasticJob(tmp_path, "localhost:3", WORKER, 3, 2, 3,
                    env={"ELASTIC_KILL": "2:1:2"}) as job:
        code, output = job.finish()
    assert code == 0, output[-8000:]
    resets = _fields(output, "RESET")
    assert sorted(w for w, _ in resets) == [0, 1], output[-8000:]
    assert {tuple(f) for _, f in resets} == {("1", "2", "2")}, resets
    batches = [tuple(map(int, f[:4])) + (float(f[4]),) for _, f in _fields(output, "BATCH")]
    # Every batch of every epoch ran once, in order: fit resumed mid-epoch.
    assert [(e, b) for e, b, *_ in batches] == [(e, b) for e in range(EPOCHS)
                                                 for b in range(STEPS)], batches
    for e, b, size, seen, _ in batches:
        expected = 3 if (e, b) < (1, 2) else 2
        # size_seen is traced into the train function: a stale trace keeps 3.
        assert size == expected and seen == expected, batches
    losses = [loss for *_, loss in batches]
    assert sum(losses[-STEPS:]) < sum(losses[:STEPS]), losses
    finals = {w: json.loads(" ".join(f[1:])) for w, f in _fields(output, "FINAL")}
    assert sorted(finals) == [0, 1] and finals[0] == finals[1], output[-8000:]
    assert leftovers(job) == []
