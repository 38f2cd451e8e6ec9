"""What tfringrun checks before it starts any rank: a supported TensorFlow
for a job that needs one, and no real Horovod under ``--horovod-compat``.

**When the TensorFlow check applies.** Only where tfringrun can tell both
which Python the ranks run and that the job imports TensorFlow, so that it
never refuses a job that would have worked:

* the rank command is a Python interpreter (``python``, ``python3.11``, a
  path to one), resolved on the ranks' ``PATH``;
* it runs a script file or ``-c`` code whose own import lines import
  ``tensorflow``, ``tf_keras``, ``tfring.tensorflow``, ``tfring.keras``,
  ``horovod.tensorflow`` or ``horovod.keras`` (or a submodule, or
  ``from tfring import keras``...).

Anything else (a shell script, ``python -m module``, a script that reaches
TensorFlow only through a module of its own, ``tfring.run``'s tasks) is
started unchecked, and a missing TensorFlow shows as the script's own
error. ``--no-tf-check`` skips the check (e.g. for a TensorFlow newer than
the supported range that you want to try).

**How.** One short subprocess of the ranks' Python, with the ranks'
environment, asks ``importlib.util.find_spec`` whether ``tensorflow`` is
importable and ``importlib.metadata`` which version is installed; no
TensorFlow import (which takes seconds). The same probe looks for a real
``horovod`` under ``--horovod-compat``, with tfring's shim left off the path.
"""
import json
import os
import re
import shutil
import subprocess
import sys

SUPPORTED = ((2, 16), (2, 21))  # first and last supported TensorFlow minor versions
TF_REQUIREMENT = "tensorflow>=2.16,<2.22"
_TF_MODULES = ("tensorflow", "tf_keras", "tfring.tensorflow", "tfring.keras",
               "horovod.tensorflow", "horovod.keras")
_TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                     "tensorflow-macos", "tf-nightly")
_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?$")
# Interpreter options that take a value (python -X dev -W error script.py).
_OPTIONS_WITH_VALUE = ("-X", "-W", "--check-hash-based-pycs")
_MAX_SCRIPT_BYTES = 4 << 20

_PROBE = """
import importlib.metadata as m, importlib.util as u, json, sys
out = {"tensorflow": u.find_spec("tensorflow") is not None, "version": None, "horovod": None}
for name in json.loads(sys.argv[1]):
    try:
        out["version"] = m.version(name)
        break
    except m.PackageNotFoundError:
        pass
if sys.argv[2] == "1":
    s = u.find_spec("horovod")
    if s is not None:
        out["horovod"] = s.origin or ", ".join(s.submodule_search_locations or [])
print(json.dumps(out))
"""


# Modules of jobs that need no TensorFlow (nor tfring's op library for it).
_NEUTRAL_MODULES = ("tfring.core", "tfring.torch", "horovod.torch", "torch")


def _within(name, modules):
    return any(name == m or name.startswith(m + ".") for m in modules)


def _is_tf_module(name):
    return _within(name, _TF_MODULES)


def _imported_modules(source):
    """The modules Python `source`'s import lines name: ``from tfring import
    keras`` names ``tfring`` and ``tfring.keras``."""
    for line in source.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.match(r"from\s+([\w.]+)\s+import\s+(.+)", line)
        if m:
            module, names = m.group(1), m.group(2)
            yield module
            for n in names.strip("()").split(","):
                if n.strip():
                    yield f"{module}.{n.strip().split()[0]}"
            continue
        m = re.match(r"import\s+(.+)", line)
        if m:
            for item in m.group(1).split(","):
                if item.strip():
                    yield item.strip().split()[0]


def imports_tensorflow(source):
    """Whether Python `source` has an import line that needs TensorFlow."""
    return any(_is_tf_module(name) for name in _imported_modules(source))


def needs_tf_library(command):
    """False when the rank command is known to need no TensorFlow op library:
    its script imports tfring.core, tfring.torch or torch and nothing of
    TensorFlow's. True when it may (a TF job, or one tfringrun cannot read)."""
    source = job_source(command) if rank_python(command, os.environ) else None
    if source is None:
        return True
    names = list(_imported_modules(source))
    return (any(_is_tf_module(n) for n in names)
            or not any(_within(n, _NEUTRAL_MODULES) for n in names))


def rank_python(command, env):
    """The interpreter the rank command runs, or None when it is not Python."""
    if not command or not _PYTHON_NAME.match(os.path.basename(command[0])):
        return None
    return shutil.which(command[0], path=env.get("PATH"))


def job_source(command):
    """The source the rank command runs (a script's text, ``-c`` code), or
    None when tfringrun cannot tell (``-m``, stdin, an unreadable file)."""
    i = 1
    while i < len(command):
        arg = command[i]
        if arg == "-c":
            return command[i + 1] if i + 1 < len(command) else None
        if arg == "-m" or arg.startswith("-m") or arg == "-":
            return None
        if arg.startswith("-c"):
            return arg[2:]
        if arg in _OPTIONS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        try:
            with open(arg, encoding="utf-8", errors="replace") as f:
                return f.read(_MAX_SCRIPT_BYTES)
        except OSError:
            return None
    return None


def probe(python, env, horovod=False):
    """What `python` (with `env`) has: {"tensorflow": importable, "version":
    installed TensorFlow version or None, "horovod": where a horovod package
    is, or None}; None when the probe itself cannot run."""
    try:
        out = subprocess.run([python, "-c", _PROBE, json.dumps(_TF_DISTRIBUTIONS),
                              "1" if horovod else "0"], env=env, capture_output=True,
                             text=True, timeout=60, stdin=subprocess.DEVNULL)
        return json.loads(out.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None  # the rank command's own start will say what is wrong


def _minor(version):
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def tensorflow_problem(python, found):
    """The message for `found` (a probe's answer), or None when it is fine."""
    low, high = (f"{a}.{b}" for a, b in SUPPORTED)
    install = (f"Install a supported one ({low} to {high}) into that environment: "
               f"`{python} -m pip install '{TF_REQUIREMENT}'`, or from tfring's source tree "
               f"`{python} -m pip install '.[tensorflow]'` (CPU) or `'.[gpu]'` (NVIDIA GPUs).")
    if not found["tensorflow"]:
        return f"this job imports TensorFlow, but {python} has none. {install}"
    minor = _minor(found["version"])
    if minor is not None and not SUPPORTED[0] <= minor <= SUPPORTED[1]:
        return (f"this job imports TensorFlow, and {python} has TensorFlow "
                f"{found['version']}, outside the range tfring supports. {install} "
                "(--no-tf-check starts the job anyway.)")
    return None


def check(command, env, horovod_compat=False, tf_check=True):
    """Runs the checks for rank command `command` with rank environment
    `env`; returns the message to refuse the job with, or None to go on."""
    python = rank_python(command, env)
    needs_tf = False
    if tf_check and python is not None:
        source = job_source(command)
        needs_tf = source is not None and imports_tensorflow(source)
    if not needs_tf and not horovod_compat:
        return None
    from tfring.runner import horovod_compat as compat
    probe_env = dict(env)
    probe_env["PYTHONPATH"] = os.pathsep.join(
        p for p in env.get("PYTHONPATH", "").split(os.pathsep)
        if p and os.path.abspath(p) != compat.SHIM_DIR)
    interpreter = python or sys.executable
    found = probe(interpreter, probe_env, horovod=horovod_compat)
    if found is None:
        return None
    if horovod_compat and found["horovod"]:
        return (f"--horovod-compat maps `import horovod` to tfring, but a real Horovod is "
                f"importable here ({found['horovod']}); which one a rank got would depend on "
                "the path order. Run the job without --horovod-compat (it then uses that "
                "Horovod), or in an environment without Horovod (`pip uninstall horovod`).")
    return tensorflow_problem(interpreter, found) if needs_tf else None
