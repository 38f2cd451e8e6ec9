"""The ring data plane asks for transparent huge pages on a large fresh
output (ring_pipeline.cc, AdviseHugePages): a framework's new 64 MB
result is then faulted in 2 MiB at a time instead of 4 KiB
(benchmarks/RESULTS_CROSS_HOST.md: the TF op's CPU per 64 MB call fell by
a third). Checked where it can show: with THP in "madvise" mode (with
"always" every large mapping gets huge pages anyway, with "never" none
does), the middle of a 64 MB allreduce's output must lie in huge pages on
every rank. The worker turns numpy's own huge-page advice off, so the output
is fresh memory nobody else advised, as TensorFlow's outputs are (checked to
fail with the ring plane of the commit before)."""
import os
import sys

import pytest

from support import ROOT, rank_lines, tfringrun

WORKER = os.path.join(ROOT, "tests", "common", "ops", "huge_pages_worker.py")
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_mode():
    try:
        with open(THP) as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return None


@pytest.mark.skipif(_thp_mode() != "madvise",
                    reason=f"transparent huge pages are not in madvise mode ({_thp_mode()})")
def test_fresh_64mb_ring_output_lies_in_huge_pages():
    result = tfringrun(2, [sys.executable, WORKER], timeout=240, controller="tcp",
                       env={"TFRING_CPU_OPERATIONS": "ring"})
    assert result.returncode == 0, result.stdout[-5000:]
    found = sorted(text.split()[1:] for _, text in rank_lines(result.stdout)
                   if text.startswith("RESULT"))
    assert [f[0] for f in found] == ["0", "1"], result.stdout[-5000:]
    for rank, kb in found:
        assert int(kb) >= 2048, f"rank {rank}: {kb} kB of the output in huge pages"
