"""Rank script for test_ring_huge_pages.py: a 64 MB allreduce into a fresh
output (tfring.core's out-of-place allreduce, whose result numpy maps anew)
on the ring plane; prints RESULT <rank> <kB of the output in huge pages>,
read from /proc/self/smaps for the mapping that holds the output."""
import numpy as np

import tfring.core as hvd


def huge_kb(address):
    """AnonHugePages (kB) of the mapping of this process that holds `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


# numpy asks for huge pages on its own large arrays; TensorFlow's allocator
# does not, and it is a result like TensorFlow's that the ring must advise.
try:
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _set_madvise_hugepage
_set_madvise_hugepage(False)

hvd.init()
x = np.ones((64 << 20) // 4, np.float32)
y = hvd.allreduce(x, op=hvd.Sum, name="fresh")
assert y[0] == hvd.size() and y[-1] == hvd.size()
print(f"RESULT {hvd.rank()} {huge_kb(y.ctypes.data + y.nbytes // 2)}", flush=True)
hvd.shutdown()
