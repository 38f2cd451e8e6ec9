"""Runs each script in examples/ at np=2 with short settings and checks what
rank 0 prints (``key=value`` results), that the other rank prints nothing,
and that only rank 0 writes checkpoints.

To see which ranks write, the checkpointing examples run under a small
wrapper that gives each rank its own ``--checkpoint-dir`` (``DIR/rank<N>``).
"""
import re
import sys

from support import import_extra, rank_lines, tfringrun

NP = 2
TIMEOUT = 120

# python -c PER_RANK_DIR BASE SCRIPT ARGS...: runs SCRIPT ARGS with
# --checkpoint-dir BASE/rank<N> added, N being this process's rank.
PER_RANK_DIR = (
    "import os, runpy, sys; base = sys.argv[1]; "
    "sys.argv = sys.argv[2:] + ['--checkpoint-dir', "
    "os.path.join(base, 'rank' + os.environ.get('TFRING_RANK', os.environ.get('PMI_RANK')))]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')")

# python -c REPORT_MPI SCRIPT ARGS...: runs SCRIPT ARGS, then tells on stderr
# whether this rank loaded mpi4py and whether MPI was initialised.
REPORT_MPI = (
    "import runpy, sys; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__'); "
    "loaded = 'mpi4py' in sys.modules; import mpi4py; mpi4py.rc.initialize = False; "
    "from mpi4py import MPI; "
    "print(f'mpi4py_loaded={loaded} mpi_initialized={MPI.Is_initialized()}', file=sys.stderr)")


def run_example(script, *args, checkpoint_base=None, np_=NP, controller=None, output=None):
    """Runs examples/`script` at `np_` ranks; returns rank 0's key=value
    results (and appends the whole output to the list `output`, if given)."""
    command = [sys.executable, f"examples/{script}", *args]
    if checkpoint_base is not None:
        command = [sys.executable, "-c", PER_RANK_DIR, str(checkpoint_base), *command[1:]]
    elif controller == "tcp":
        command = [sys.executable, "-c", REPORT_MPI, *command[1:]]
    result = tfringrun(np_, command, timeout=TIMEOUT, controller=controller)
    if output is not None:
        output.append(result.stdout)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout[-10000:]}"
    lines = rank_lines(result.stdout)
    others = [text for rank, text in lines if rank != 0 and text.strip()]
    assert not others, f"{script}: ranks other than 0 printed to stdout: {others[:5]}"
    values = {}
    for _, text in lines:
        values.update(re.findall(r"(\w+)=(\S+)", text))
    return values


def test_keras_digits(tmp_path):
    # 4 epochs give 0.958 (the run is deterministic); the default 10 give 0.97.
    values = run_example("keras_digits.py", "--epochs", "4", checkpoint_base=tmp_path)
    assert float(values["val_accuracy"]) >= 0.90, values
    assert (tmp_path / "rank0" / "best.keras").is_file()
    assert values["checkpoint"] == str(tmp_path / "rank0" / "best.keras")
    assert not (tmp_path / "rank1").exists(), "rank 1 wrote a checkpoint"


def test_keras_digits_trains_alike_under_tcp_and_mpi_at_np3():
    """Issue 9's acceptance run: the same training over the TCP transport
    reaches the accuracy it reaches over MPI, and no rank initialises MPI."""
    accuracy = {}
    for controller in ("mpi", "tcp"):
        output = []
        values = run_example("keras_digits.py", "--epochs", "4", np_=3, controller=controller,
                             output=output)
        accuracy[controller] = float(values["val_accuracy"])
        if controller == "tcp":
            reports = [text for _, text in rank_lines(output[0], "stderr")
                       if text.startswith("mpi4py_loaded=")]
            assert reports == ["mpi4py_loaded=False mpi_initialized=False"] * 3, output[0][-5000:]
    assert accuracy["mpi"] >= 0.90, accuracy
    # The sums run in another order over TCP (a ring instead of MPI's
    # algorithm), so the last bits of a float may differ: allow one sample.
    assert abs(accuracy["tcp"] - accuracy["mpi"]) <= 0.005, accuracy


def test_tf2_custom_loop():
    values = run_example("tf2_custom_loop.py", "--steps", "150")
    assert values["ranks_in_sync"] == "True", values  # broadcast + averaged gradients
    assert float(values["test_accuracy"]) >= 0.90, values
    assert float(values["final_loss"]) < 1.0, values


def test_tf1_monitored_session(tmp_path):
    values = run_example("tf1_monitored_session.py", "--steps", "200",
                         checkpoint_base=tmp_path)
    first, final = float(values["first_loss"]), float(values["final_loss"])
    assert first > 1.5 and final < 0.6 * first, values
    assert (tmp_path / "rank0" / "checkpoint").is_file()
    assert list((tmp_path / "rank0").glob("model.ckpt-200.index"))
    assert not (tmp_path / "rank1").exists(), "rank 1 wrote a checkpoint"


def test_keras_synthetic_benchmark():
    values = run_example("keras_synthetic_benchmark.py", "--model-size", "tiny",
                         "--num-warmup-batches", "2", "--num-batches-per-iter", "2",
                         "--num-iters", "3")
    per_rank, total = float(values["images_per_sec_per_rank"]), float(
        values["total_images_per_sec"])
    assert per_rank > 0 and abs(total - NP * per_rank) < 0.1 + 1e-3 * total, values


def test_torch_digits():
    import_extra("torch")
    values = run_example("torch_digits.py", "--epochs", "3")
    assert float(values["val_accuracy"]) >= 0.90, values
