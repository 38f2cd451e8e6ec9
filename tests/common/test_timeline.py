"""The timeline: Chrome trace JSON written by rank 0, parsed back here."""
import json
import sys
import textwrap

import pytest

from support import tfringrun

SCRIPT = textwrap.dedent("""
    import sys
    import tensorflow as tf
    import tfring.tensorflow as hvd
    hvd.init()

    @tf.function
    def step():
        return [hvd.allreduce(tf.fill([64], float(i)), name=f"grad_{i}") for i in range(5)]
    for _ in range(3):
        step()
    hvd.grouped_allreduce([tf.ones([8]) * i for i in range(3)], name="group")
    hvd.allgather(tf.ones([hvd.rank() + 1]), name="gathered")
    hvd.broadcast(tf.ones([4]), 0, name="sent")
    hvd.start_timeline(sys.argv[1], mark_cycles=True)   # a second file, from the API
    hvd.allreduce(tf.ones([3]), name="late")
    hvd.stop_timeline()
    hvd.shutdown()
""")


def events_by_tensor(path):
    with open(path) as f:
        events = json.load(f)  # must be valid JSON
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "process_name"}
    by_tensor = {}
    for e in events:
        if e.get("ph") != "M" and e.get("pid") in names:
            by_tensor.setdefault(names[e["pid"]], []).append(e)
    return events, by_tensor


@pytest.mark.parametrize("np_", [2, 3])
def test_timeline_records_every_phase(tmp_path, np_):
    env_path, api_path = tmp_path / "env.json", tmp_path / "api.json"
    result = tfringrun(np_, [sys.executable, "-c", SCRIPT, str(api_path)], timeout=120,
                       env={"TFRING_TIMELINE": str(env_path)})
    assert result.returncode == 0, result.stdout
    events, by_tensor = events_by_tensor(env_path)
    assert {"grad_0", "grad_4", "gathered", "sent"} <= set(by_tensor)
    grad = [e.get("name") for e in by_tensor["grad_0"]]
    assert "NEGOTIATE_ALLREDUCE" in grad and "QUEUE" in grad
    assert any(n and n.endswith("_ALLREDUCE") and not n.startswith("NEGOTIATE") for n in grad)
    # The first time it is negotiated, the coordinator ticks each rank as it arrives.
    ticks = {e["name"] for e in by_tensor["grad_0"] if e["ph"] == "i"}
    assert ticks == {str(r) for r in range(np_)}
    # A group is always fused into one buffer.
    assert any(e.get("name") == "MEMCPY_IN_FUSION_BUFFER" for e in by_tensor["group_0"])
    assert any(e.get("name", "").endswith("_ALLGATHER") for e in by_tensor["gathered"])
    assert any(e.get("name", "").endswith("_BROADCAST") for e in by_tensor["sent"])
    # Every begin has its end.
    for tensor, evs in by_tensor.items():
        assert sum(e["ph"] == "B" for e in evs) == sum(e["ph"] == "E" for e in evs), tensor

    api_events, api_tensors = events_by_tensor(api_path)
    assert "late" in api_tensors
    assert any(e.get("name") == "CYCLE_START" for e in api_events)
