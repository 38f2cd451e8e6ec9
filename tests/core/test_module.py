"""The framework-neutral module builds, loads and runs with no TensorFlow
importable, and says clearly when it is used before init()."""
import textwrap

from support import run_python

# Refuses any import of TensorFlow, even one an `except ImportError` swallows
# (it is reported on stderr too).
NO_TF = textwrap.dedent("""
    import sys

    class RefuseTensorflow:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
                sys.stderr.write("IMPORTED " + name + "\\n")
                raise ImportError("no TensorFlow in this test")
            return None

    sys.meta_path.insert(0, RefuseTensorflow())
""")


def run_without_tf(code, core_module_path, **env):
    env = {"TFRING_CORE_LIBRARY": core_module_path, "TFRING_CONTROLLER": "", **env}
    return run_python(NO_TF + textwrap.dedent(code), env=env, timeout=120)


def test_builds_and_runs_without_tensorflow(core_module_path, tmp_path):
    # The build itself runs with TensorFlow refused: it must need none. The
    # cache has the module already (the fixture built it), so this is the
    # cache lookup, compile flags and all, under the same key.
    build = run_python(NO_TF + textwrap.dedent("""
        from tfring.build import core_module
        print(core_module.ensure_module())
    """), timeout=120)
    assert build.returncode == 0 and "IMPORTED" not in build.stderr, build.stderr
    assert build.stdout.strip() == core_module_path

    run = run_without_tf("""
        import numpy as np
        import tfring.core as hvd
        assert not hvd.is_initialized()
        hvd.init()
        out = hvd.allreduce(np.arange(3, dtype=np.float32), op=hvd.Sum)
        print("RESULT", hvd.rank(), hvd.size(), out.tolist(), hvd.nccl_built())
        hvd.shutdown()
        print("TF_LOADED", "tensorflow" in sys.modules)
    """, core_module_path)
    assert run.returncode == 0, run.stderr
    assert "IMPORTED" not in run.stderr
    assert "RESULT 0 1 [0.0, 1.0, 2.0]" in run.stdout
    assert "TF_LOADED False" in run.stdout


def test_calls_before_init_raise_a_clear_error(core_module_path):
    run = run_without_tf("""
        import numpy as np
        import tfring.core as hvd
        for call in (lambda: hvd.allreduce(np.ones(2)), hvd.rank, hvd.size,
                     lambda: hvd.broadcast_async(np.ones(1), 0), hvd.barrier):
            try:
                call()
            except hvd.NotInitializedError as e:
                assert isinstance(e, ValueError) and e.code == 2, e
                print("ERROR", e)
            else:
                print("NO_ERROR")
    """, core_module_path)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line]
    assert len(lines) == 5 and all(line.startswith("ERROR ") for line in lines), run.stdout
    assert all("init()" in line for line in lines), run.stdout
