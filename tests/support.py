"""Helpers shared by the outer test suites: launching jobs with tfringrun."""
import atexit
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The controllers (transports) every multi-rank suite runs under.
CONTROLLERS = ["mpi", "tcp"]


def tfringrun(np_, args, timeout=300, env=None, extra=(), python=sys.executable,
              controller=None):
    """Runs `args` on `np_` ranks with tfringrun, killing the job after
    `timeout` seconds; returns the CompletedProcess (stdout+stderr merged).
    `python` is the interpreter that runs tfringrun (another environment's,
    e.g. one with an older TensorFlow); `controller` "mpi" or "tcp" picks
    the transport (tfringrun's default when None)."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    cmd = [python, "-m", "tfring.runner.launch", "-np", str(np_),
           "--timeout", str(timeout), *([f"--{controller}"] if controller else []), *extra,
           *args]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout + 60)


SANITIZED_CXX = ["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined",
                 "-fno-sanitize-recover=undefined", "-Wall", "-Werror"]


_objects_dir = None


def _ccache():
    """ccache's command prefix, and the environment that lets two checkouts
    share its entries ([], {} where ccache is missing). ccache keys an object
    by the preprocessed source, the flags and the compiler, so the C++ test
    programs compile only what changed since the last run, in any checkout
    (CI's fresh clone included): paths are taken relative to the checkout,
    and the working directory, which -g would put in the key, is left out."""
    path = shutil.which("ccache")
    if path is None:
        return [], {}
    return [path], {"CCACHE_BASEDIR": ROOT, "CCACHE_NOHASHDIR": "1"}


def _object(source, command, headers, timeout):
    """The object file of `source` compiled by `command` (compiler and
    flags), from this test run's store: most test programs link the same
    core files with the same flags. The store's key covers the command, the
    file and every header of the tree (`headers`, a digest), so an edited
    file is compiled again; across runs ccache answers (_ccache)."""
    global _objects_dir
    if _objects_dir is None:
        _objects_dir = tempfile.mkdtemp(prefix="tfring-test-objects-")
        atexit.register(shutil.rmtree, _objects_dir, True)
    with open(source, "rb") as f:
        key = hashlib.sha256(f.read())
    key.update("\0".join([*command, os.path.abspath(source), headers]).encode())
    obj = os.path.join(_objects_dir, key.hexdigest()[:32] + ".o")
    if not os.path.exists(obj):
        partial = obj + f".{os.getpid()}.{threading.get_ident()}.tmp"
        prefix, env = _ccache()
        build = subprocess.run([*prefix, *command, "-c", "-o", partial, source],
                               capture_output=True, text=True, timeout=timeout,
                               env={**os.environ, **env})
        assert build.returncode == 0, f"{source}:\n{build.stderr}"
        os.replace(partial, obj)
    return obj


def _headers_digest():
    """A digest of every C++ header under tf_ops/ (what a cached object may
    depend on besides its own file)."""
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(os.path.join(ROOT, "tf_ops"))):
        for name in sorted(files):
            if name.endswith(".h"):
                path = os.path.join(folder, name)
                digest.update(path.encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()


def build_cpp(binary, sources, command, libs=(), flags_for=None, timeout=900):
    """Builds a C++ program from `sources` with `command` (the compiler and
    its flags, a list; `flags_for(source)` adds a file's own flags) and
    links it with `libs`; fails with the compiler's output. Each file is
    compiled once per test run and command, on every core at once, and
    ccache keeps the objects across runs. Returns the binary's path (a str)."""
    headers = _headers_digest()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(
            lambda src: _object(src, [*command, *(flags_for(src) if flags_for else [])],
                                headers, timeout), sources))
    link = subprocess.run([*command, "-o", str(binary), *objects, *libs],
                          capture_output=True, text=True, timeout=timeout)
    assert link.returncode == 0, link.stderr[-5000:]
    return str(binary)


def build_sanitized_cpp(binary, sources, flags=(), libs=(), build_timeout=900):
    """Builds a C++ test program under ASan/UBSan (build_cpp with
    SANITIZED_CXX and `flags`); a cold build of a program is ~1 min of CPU,
    and minutes of wall time under load. Returns the binary's path."""
    return build_cpp(binary, sources, [*SANITIZED_CXX, *flags], libs, timeout=build_timeout)


def run_sanitized_cpp_test(binary, sources, flags=(), libs=(), build_timeout=900):
    """Builds a C++ test program under ASan/UBSan (build_sanitized_cpp) and
    runs it without arguments; fails with the program's output unless it
    reports ", 0 failed". Returns its stdout."""
    build_sanitized_cpp(binary, sources, flags, libs, build_timeout)
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert ", 0 failed" in run.stdout
    return run.stdout


def run_python(code, timeout=120, env=None):
    """Runs `code` in a fresh single-process Python (no launcher) from the
    repository root; returns the CompletedProcess (stdout and stderr apart)."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_rank_suite(np_, suites, timeout=600, env=None, python=sys.executable, args=(),
                   controller=None):
    """Runs */ranks/ pytest suites (`suites`: a directory or file, or a list
    of them, collected by one pytest in each rank: one launch for them all)
    on every rank, with `python`, extra pytest `args`, under `controller`;
    fails with each rank's report if any rank failed. The failure names the
    configuration; pytest's own lines, each prefixed with its rank, name the
    test."""
    suites = [suites] if isinstance(suites, (str, os.PathLike)) else list(suites)
    env = dict(env or {}, TFRING_RANK_TESTS="1")
    # -x: a rank whose test fails stops there, with pytest's summary naming
    # the test. Its peers, which may be waiting in that test's next
    # collective, then hear that the rank has finished, fail and stop too,
    # instead of waiting out the job's timeout with the name unprinted.
    # -o addopts=: the outer run's default options (pyproject.toml: two
    # xdist workers) are not a rank's; each rank runs its suite in its own
    # process, with a Python that may not have xdist (the install matrix's).
    result = tfringrun(np_, [python, "-m", "pytest", *map(str, suites), "-q", "-x", "-p",
                             "no:cacheprovider", "-o", "addopts=", *args],
                       timeout=timeout, env=env, python=python, controller=controller)
    where = " + ".join(os.path.relpath(str(s), ROOT) for s in suites)
    assert result.returncode == 0, (
        f"{where} failed at np={np_} under {controller or 'the default controller'} "
        f"(exit {result.returncode}):\n{result.stdout[-20000:]}")
    return result.stdout


def check_rank_suite(np_, suites, controller=None, **kwargs):
    """run_rank_suite, then checks that every rank reported its own pass
    line; returns the output."""
    output = run_rank_suite(np_, suites, controller=controller, **kwargs)
    passed = {r for r, text in rank_lines(output) if re.search(r"\d+ passed", text)}
    assert sorted(passed) == list(range(np_)), output[-5000:]
    return output


_PREFIX = re.compile(r"^\[(\d+)\](?:<(stdout|stderr)>)?:?\s?(.*)$")


def rank_lines(output, stream="stdout"):
    """[(rank, text)] for the lines tfringrun prefixed with a rank."""
    lines = []
    for line in output.splitlines():
        m = _PREFIX.match(line)
        if m and (m.group(2) in (None, stream)):
            lines.append((int(m.group(1)), m.group(3)))
    return lines


def live_pids(pids, wait=0.0):
    """Those of `pids` that are still running (not zombies), after waiting up
    to `wait` seconds for them all to end."""
    import time

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
        except OSError:
            return False

    deadline = time.monotonic() + wait
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


# Every process a test starts inherits, in its environment, the tag of the
# pytest process (an xdist worker, or the only one) that started it; checks
# for leftovers look only at processes that carry it (started_here), so that
# two workers, or two runs, never take each other's processes for their own.
SESSION_TAG_ENV = "TFRING_TEST_SESSION"


def session_tag():
    """This pytest process's tag (set by tests/conftest.py; its children
    inherit it)."""
    return os.environ[SESSION_TAG_ENV]


def started_here(pid):
    """True when process `pid` carries this pytest process's tag in its
    environment: it was started by this process or its descendants (even if
    it has since lost its parent)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{SESSION_TAG_ENV}={session_tag()}".encode() in env


def missing_tool(what):
    """Ends a test that needs a build tool this machine lacks (`what`: its
    name and how to get it): a skip, but a failure where
    ``TFRING_REQUIRE_TOOLCHAIN=1`` (CI, which has g++ and mpicxx: C++ suites
    that silently skipped there would prove nothing)."""
    import pytest
    if os.environ.get("TFRING_REQUIRE_TOOLCHAIN") == "1":
        pytest.fail(f"needs {what}, and TFRING_REQUIRE_TOOLCHAIN=1 says this machine has it")
    pytest.skip(f"needs {what}")


def xla_kernels_expected(tf_version):
    """Whether tfring's collectives have XLA kernels with this TensorFlow:
    from 2.20 on, whose wheels ship XLA's typed-FFI headers (README, XLA);
    2.16 to 2.19 run a DistributedOptimizer's step without XLA. The tests of
    XLA's own path run only where it exists (and fail there if it is
    missing), not skipped one by one."""
    major, minor = (int(x) for x in tf_version.split(".")[:2])
    return (major, minor) >= (2, 20)


def skip_module_without_xla_kernels(tf_version):
    """Skips the calling test module (XLA's own path) where this TensorFlow
    gives tfring no XLA kernels (see xla_kernels_expected)."""
    import pytest
    if not xla_kernels_expected(tf_version):
        pytest.skip(f"TensorFlow {tf_version} has no XLA typed-FFI headers: tfring's "
                    "collectives have no XLA kernels there", allow_module_level=True)


def missing_gpu(why):
    """Ends a GPU test whose GPU, framework or GPU build is missing (`why`
    says which): a skip, but a failure where ``TFRING_REQUIRE_GPU=1``
    (tests/gpu/run_on_gpu.sh, on a GPU machine: a skip there would prove
    nothing)."""
    import pytest
    if os.environ.get("TFRING_REQUIRE_GPU") == "1":
        pytest.fail(why)
    pytest.skip(why)


def import_extra(name):
    """Imports the optional engine `name` (ray, pyspark) for its suite: a
    skip where it is not installed, but a failure where
    ``TFRING_REQUIRE_EXTRAS=1`` (CI, which installs the extras: a suite that
    silently skipped there would prove nothing)."""
    import importlib

    import pytest
    if os.environ.get("TFRING_REQUIRE_EXTRAS") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


def extra_missing(error):
    """For a suite's optional dependency found missing some other way than
    by import (`error`, the exception that said so): a skip, or, where
    ``TFRING_REQUIRE_EXTRAS=1``, the failure itself (as import_extra)."""
    import pytest
    if os.environ.get("TFRING_REQUIRE_EXTRAS") == "1":
        raise error
    pytest.skip(f"an optional dependency is missing: {error}")
