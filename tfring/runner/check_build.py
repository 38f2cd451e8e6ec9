"""``tfringrun --check-build``: what this tfring install was built with.

The output follows ``horovodrun --check-build``, so scripts and people who
read that one can read this one. The build facts come from
``tfring.common.basics``; it is imported only here, because importing it
loads TensorFlow and the op library, which a plain launch must not pay for.
"""
import importlib
import importlib.util
import os
import sys


def _flag(module, name, problems):
    """[X] when module.name() is true; [?] when it cannot be asked (and why,
    appended to ``problems``: a library that fails to load must not pass for
    a feature that is simply absent)."""
    fn = getattr(module, name, None)
    if fn is None:
        problems.append(f"{module.__name__}.{name} does not exist")
        return "[?]"
    try:
        return "[X]" if fn() else "[ ]"
    except Exception as e:
        problems.append(f"{name}() failed: {type(e).__name__}: {e}")
        return "[?]"


def build_facts():
    """(lines, problems): the running TensorFlow and which op library it gets
    (building it into the cache first if there is none for this TF)."""
    lines, problems = [], []
    try:
        import tensorflow as tf
    except Exception as e:
        return [], [f"TensorFlow cannot be imported: {type(e).__name__}: {e}"]
    lines.append(f"TensorFlow {tf.__version__} ({os.path.dirname(tf.__file__)})")
    from tfring.build import cache
    from tfring.common import loader
    try:
        path = loader.library_path()
    except ImportError as e:
        problems.append(f"op library: {e}")
        return lines, problems
    if os.environ.get("TFRING_LIBRARY") or os.environ.get("HOROVOD_LIBRARY"):
        origin = "from TFRING_LIBRARY"
    elif path == cache.packaged_library():
        built_for = cache.packaged_tf_version()
        origin = (f"installed with tfring, built for TensorFlow {built_for}" if built_for
                  else "installed with tfring, no build record (e.g. Bazel)")
    else:
        info = cache.read_build_info(os.path.dirname(path)) or {}
        origin = (f"build cache, built for TensorFlow {info.get('tf_version', '?')} "
                  f"in {info.get('seconds', '?')} s")
    lines.append(f"Op library: {path} ({origin})")
    return lines, problems


def _optional_flag(module, name):
    """[X]/[ ] for a probe that older libraries do not have (absent = not built)."""
    fn = getattr(module, name, None)
    try:
        return "[X]" if fn is not None and fn() else "[ ]"
    except Exception:
        return "[?]"


def report(basics, version, build=None):
    """The check-build text for an imported basics module, and whether every
    probe could be answered. ``build`` is :func:`build_facts`' result, if
    taken."""
    problems = []
    build_lines, build_problems = build or ([], [])
    problems += build_problems
    has_tf = importlib.util.find_spec("tensorflow") is not None
    mpi = _flag(basics, "mpi_built", problems)
    gloo = _flag(basics, "gloo_built", problems)
    tcp = _optional_flag(basics, "tcp_built")
    nccl = _flag(basics, "nccl_built", problems)
    lines = [f"tfring v{version}:", ""]
    if build_lines:
        lines += build_lines + [""]
    lines += [
        "Available Frameworks:",
        f"    [{'X' if has_tf else ' '}] TensorFlow",
        "    [ ] PyTorch",
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        f"    {mpi} MPI",
        f"    {gloo} Gloo",
        f"    {tcp} TCP",
        "",
        "Available Tensor Operations:",
        f"    {nccl} NCCL",
        "    [ ] DDL",
        "    [ ] CCL",
        f"    {mpi} MPI",
        f"    {gloo} Gloo",
    ]
    if problems:
        lines += ["", "Problems:"] + [f"    {p}" for p in problems]
    return "\n".join(lines), not problems


def main():
    # Keep TensorFlow's start-up logging out of the report, as in the ranks.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        basics = importlib.import_module("tfring.common.basics")
    except Exception as e:  # any import failure means a broken install
        print(f"tfringrun: cannot import tfring.common.basics: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1
    version = getattr(sys.modules.get("tfring"), "__version__", "unknown")
    text, complete = report(basics, version, build_facts())
    print(text)
    return 0 if complete else 1
