"""An allreduce over a rate-limited link between two fake hosts (the CI
short version of benchmarks/cross_host.py, issue 26).

Two fake hosts (tests/netns_support.py), one rank each, whose veths a token
bucket (tc tbf) limits to 1 Gbit/s each way; a 16 MB allreduce under
tfringrun --tcp must be right element by element and reach more than half
the link's rate. It must also stay under the rate (plus the bucket's burst):
above it, the shaping was not in effect and the test would prove nothing.
The fake hosts, their links and qdiscs and every process in them are
removed on exit, whatever happens. Needs root, `ip netns` and `tc`.
"""
import os
import shutil
import sys

import pytest

import netns_support
from support import ROOT, rank_lines, tfringrun

WORKER = os.path.join(ROOT, "tests", "common", "transport", "shaped_link_worker.py")
RATE_BITS = 1e9

pytestmark = pytest.mark.skipif(not netns_support.available() or shutil.which("tc") is None,
                                reason="needs root, network namespaces (ip netns) and tc")


def test_16mb_allreduce_over_a_1gbit_link(tmp_path):
    names = ["h0", "h1"]
    with netns_support.FakeHosts(names) as hosts:
        hosts.shape("1gbit")
        for name in names:
            assert hosts.shaping(name) == ["1Gbit", "1Gbit"], hosts.shaping(name)
        hosts.ssh_command(str(tmp_path))
        env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
        result = tfringrun(2, [sys.executable, WORKER, "16"], timeout=240, env=env,
                           controller="tcp",
                           extra=["-H", "h0:1,h1:1", "--network-interfaces", hosts.interfaces()])
    assert result.returncode == 0, result.stdout[-5000:]
    found = [text.split() for _, text in rank_lines(result.stdout) if text.startswith("RESULT")]
    assert sorted(int(f[1]) for f in found) == [0, 1], result.stdout[-5000:]
    busbw = float(found[0][2])
    print(f"16 MB allreduce over 1 Gbit/s links: busbw {busbw / 1e9:.3f} Gbit/s")
    assert busbw > 0.5 * RATE_BITS, busbw
    # 16 MB at 1 Gbit/s takes ~130 ms; a 512 KB burst adds at most a few %.
    assert busbw < 1.25 * RATE_BITS, f"{busbw / 1e9:.2f} Gbit/s: faster than the shaped link"
