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


def report(basics, version):
    """The check-build text for an imported basics module, and whether every
    probe could be answered."""
    problems = []
    has_tf = importlib.util.find_spec("tensorflow") is not None
    mpi = _flag(basics, "mpi_built", problems)
    gloo = _flag(basics, "gloo_built", problems)
    nccl = _flag(basics, "nccl_built", problems)
    lines = [
        f"tfring v{version}:",
        "",
        "Available Frameworks:",
        f"    [{'X' if has_tf else ' '}] TensorFlow",
        "    [ ] PyTorch",
        "    [ ] MXNet",
        "",
        "Available Controllers:",
        f"    {mpi} MPI",
        f"    {gloo} Gloo",
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
    text, complete = report(basics, version)
    print(text)
    return 0 if complete else 1
