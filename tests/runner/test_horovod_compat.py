"""tfringrun --horovod-compat (tfring/runner/horovod_compat.py and the
horovod shim): Horovod-style scripts run unchanged; never on by default;
refused where a real horovod is importable; horovod.torch says it is missing."""
import os
import sys
import textwrap

import cloudpickle
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tfring  # noqa: E402
from launch_support import rank_lines, tfringrun  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import it

# Written like Horovod's TF2 Keras examples: only horovod imports.
HOROVOD_KERAS_SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import horovod
    import horovod.tensorflow.keras as hvd
    import horovod.tensorflow as hvd_tf
    from horovod.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback
    from horovod.common.exceptions import HorovodInternalError
    import horovod.keras
    import horovod.tensorflow.elastic

    hvd.init()
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(loss="mse", optimizer=opt)
    rng = np.random.RandomState(hvd.rank())
    x, y = rng.rand(32, 4).astype("float32"), rng.rand(32, 1).astype("float32")
    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.MetricAverageCallback()])
    kernel = tf.reshape(model.layers[0].kernel, [1, -1])
    gathered = hvd_tf.allgather(kernel).numpy()
    same = bool((gathered == gathered[0]).all())
    print("HVD", hvd.rank(), hvd.size(), same, hvd.__name__, horovod.run.__module__,
          HorovodInternalError.__module__, horovod.tensorflow.elastic.run.__module__,
          horovod.keras.DistributedOptimizer is hvd.DistributedOptimizer, flush=True)
""")


def test_a_horovod_keras_script_runs_unchanged_at_np2(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HOROVOD_KERAS_SCRIPT)
    proc, _ = tfringrun("-np", "2", "--horovod-compat", "--timeout", "300", sys.executable,
                        str(script), timeout=360)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = rank_lines(proc.stdout)
    for rank in (0, 1):
        hvd_lines = [line.split() for line in lines[rank] if line.startswith("HVD")]
        assert hvd_lines == [["HVD", str(rank), "2", "True", "horovod.tensorflow.keras",
                              "tfring.runner.api", "tfring.common.exceptions",
                              "tfring.tensorflow.elastic", "True"]], proc.stdout


def test_horovod_is_not_importable_without_the_flag():
    proc, _ = tfringrun("-np", "1", sys.executable, "-c", "import horovod")
    assert proc.returncode == 1
    assert "No module named 'horovod'" in proc.stderr


def test_horovod_torch_is_a_clear_import_error():
    proc, _ = tfringrun("-np", "1", "--horovod-compat", sys.executable, "-c",
                        "import horovod.torch")
    assert proc.returncode == 1
    assert "ImportError: horovod.torch is not provided by tfring (yet)" in proc.stderr


def test_a_real_horovod_on_the_path_is_refused_before_any_rank_starts(tmp_path):
    fake = tmp_path / "site" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    marker = tmp_path / "started"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    proc, _ = tfringrun("-np", "2", "--horovod-compat", sys.executable, "-c",
                        f"open({str(marker)!r}, 'w')", env=env)
    assert proc.returncode == 1
    assert (f"a real Horovod is importable here ({fake / '__init__.py'})" in proc.stderr
            and "No rank was started." in proc.stderr), proc.stderr
    assert not marker.exists()


def horovod_names():
    import horovod
    import horovod.common.exceptions as exceptions
    import horovod.runner
    return (horovod.__version__, horovod.run.__module__, exceptions.HorovodInternalError.__module__,
            horovod.runner.run.__module__)


def test_tfring_run_takes_horovod_compat():
    expected = (tfring.__version__, "tfring.runner.api", "tfring.common.exceptions",
                "tfring.runner.api")
    assert tfring.run(horovod_names, num_proc=2, use_gloo=True, horovod_compat=True,
                      timeout=120) == [expected, expected]
    with pytest.raises(ModuleNotFoundError, match="No module named 'horovod'"):
        tfring.run(horovod_names, num_proc=1, use_gloo=True, timeout=120)
