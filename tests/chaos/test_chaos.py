"""The short chaos run (tests/chaos/chaos.py): a seeded schedule of faults
against elastic Keras training on 4 fake hosts, every fault type at least
once, each round checked (progress within the bound, equal weights, the
loss on the replay's path, a launcher line naming the fault, no traceback)
and nothing left at the end. The hour-long run is benchmarks/chaos.py.

Needs root and network namespaces; skipped (with the reason) elsewhere."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chaos  # noqa: E402
import netns_support  # noqa: E402

pytestmark = pytest.mark.skipif(not netns_support.available(),
                                reason="needs root and network namespaces (ip netns)")

# Ten rounds cover the five faults (the schedule takes each once before it
# repeats any) in about a minute and a half on a 2-core VM.
SEED, ROUNDS = 2026, 10


def test_seeded_faults_leave_the_job_training_on_the_reference_path(tmp_path):
    run = chaos.ChaosRun(tmp_path, seed=SEED, hosts=4, bound=120.0)
    report = run.run(rounds=ROUNDS)
    faults = [r["fault"] for r in report["rounds"]]
    assert set(faults) == set(chaos.FAULTS), faults
    assert report["exit_code"] == 0 and report["final_weights_equal"]
    assert not any(report["left"].values()), report["left"]
