"""`import tfring.tensorflow.keras as hvd` (Horovod's most common Keras import)
gives tfring.keras itself, and tfring.keras re-exports what
horovod.tensorflow.keras does. Each check runs in a fresh interpreter, so the
alias is tested as a first import too, with Keras 3 and with tf_keras."""
import textwrap

import pytest

from support import run_python

CHECK = textwrap.dedent("""
    import sys
    import tfring.tensorflow.keras as hvd
    from tfring.tensorflow.keras import callbacks
    import tfring.tensorflow.keras.callbacks as callbacks_module
    from tfring.tensorflow.keras.callbacks import BroadcastGlobalVariablesCallback
    import tfring.keras
    import tfring.tensorflow as hvd_tf

    assert hvd is tfring.keras and hvd_tf.keras is tfring.keras, hvd
    assert callbacks is callbacks_module is tfring.keras.callbacks
    assert BroadcastGlobalVariablesCallback is tfring.keras.callbacks.BroadcastGlobalVariablesCallback
    # No tfring.keras file was loaded a second time under the other name.
    for name, module in list(sys.modules.items()):
        if name.startswith("tfring.tensorflow.keras."):
            twin = sys.modules["tfring.keras." + name[len("tfring.tensorflow.keras."):]]
            assert module is twin, name

    # What horovod.tensorflow.keras re-exports, the same objects as in tfring.tensorflow.
    for name in ["init", "shutdown", "is_initialized", "start_timeline", "stop_timeline",
                 "size", "local_size", "cross_size", "rank", "local_rank", "cross_rank",
                 "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
                 "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
                 "rocm_built", "ProcessSet", "global_process_set", "add_process_set",
                 "remove_process_set", "Average", "Sum", "Compression"]:
        assert getattr(hvd, name) is getattr(hvd_tf, name), name
    from tfring.common import loader
    assert hvd.mpi_built() and hvd.mpi_enabled()
    assert hvd.gloo_built() is hasattr(loader.load()[1], "init_tcp")
    assert not (hvd.gloo_enabled() or hvd.rocm_built() or hvd.ccl_built() or hvd.ddl_built())
    assert hvd.cuda_built() == hvd.nccl_built()
    assert callable(hvd.PartialDistributedOptimizer)
    print("OK", type(hvd.DistributedOptimizer).__name__)
""")


@pytest.mark.parametrize("flavour", ["keras3", "tf_keras"])
def test_tensorflow_keras_is_tfring_keras(flavour, monkeypatch):
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else {}
    result = run_python(CHECK, env=env)
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr
