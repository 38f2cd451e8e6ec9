"""tfring/build/library.py and cache.py: the locked per-TF-version cache, the compile,
the choice between the installed library and the cache, and the package data.

The compiles here are real but small (a one-function C++ file), so these run
in seconds; tests/build/test_install.py builds the real library in a fresh
environment.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from tfring.build import cache, library, unit_tests

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A process that builds a tiny real library into ENTRY through locked_build,
# appending one line to COUNT per compile; "started" is written to SIGNAL when
# its build begins, and the build then waits for GO to exist, so the test can
# hold one build open while a second process arrives.
_BUILDER = textwrap.dedent(r"""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from tfring.build import cache, library
    entry, count, signal, go, src = sys.argv[2:7]

    def build(out):
        with open(signal, "w") as f:
            f.write("started")
        deadline = time.time() + 60
        while not os.path.exists(go) and time.time() < deadline:
            time.sleep(0.05)
        options = library.BuildOptions(sources=[src], extra_compile_args=["-fPIC", "-O0"])
        library.compile_library(out, options, os.path.dirname(src), jobs=1,
                                log=lambda m: None)
        with open(count, "a") as f:
            f.write(f"{os.getpid()}\n")

    path = cache.locked_build(entry, build, log=lambda m: print("LOG", m, flush=True))
    print("PATH", path, flush=True)
""")


def _tiny_source(tmp_path):
    src = tmp_path / "tiny.cc"
    src.write_text('extern "C" int tfring_tiny() { return 42; }\n')
    return str(src)


def _wait_for(path, timeout=60):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_two_processes_build_once_under_the_lock(tmp_path):
    entry = str(tmp_path / "cache" / "entry")
    count, go = str(tmp_path / "count"), str(tmp_path / "go")
    src = _tiny_source(tmp_path)

    def start(signal):
        return subprocess.Popen(
            [sys.executable, "-c", _BUILDER, ROOT, entry, count, signal, go, src],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first = start(str(tmp_path / "signal1"))
    try:
        _wait_for(str(tmp_path / "signal1"))  # the first holds the lock, mid-build
        second = start(str(tmp_path / "signal2"))
        try:
            time.sleep(1.5)  # the second is now blocked on the lock
            assert second.poll() is None, second.communicate()[0]
            open(go, "w").close()
            out2, _ = second.communicate(timeout=120)
        finally:
            second.kill()
        out1, _ = first.communicate(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, (out1, out2)
    assert not os.path.exists(str(tmp_path / "signal2")), "the second process built too"
    with open(count) as f:
        assert len(f.read().split()) == 1
    target = os.path.join(entry, library.LIBRARY_NAME)
    assert f"PATH {target}" in out1 and f"PATH {target}" in out2
    assert "another process finished building" in out2, out2
    import ctypes
    assert ctypes.CDLL(target).tfring_tiny() == 42
    assert [n for n in os.listdir(entry) if n.endswith(".tmp")] == []


def test_failed_build_leaves_nothing_and_releases_the_lock(tmp_path):
    entry = str(tmp_path / "entry")

    def broken(out):
        with open(out, "w") as f:
            f.write("half")
        raise library.BuildError("compiler crashed")

    with pytest.raises(library.BuildError, match="compiler crashed"):
        cache.locked_build(entry, broken)
    assert not os.path.exists(os.path.join(entry, library.LIBRARY_NAME))
    assert os.listdir(entry) == []
    # The lock is free again: the next build goes through.
    src = _tiny_source(tmp_path)
    options = library.BuildOptions(sources=[src], extra_compile_args=["-fPIC"])
    path = cache.locked_build(
        entry, lambda out: library.compile_library(out, options, str(tmp_path), jobs=1))
    assert os.path.exists(path)


def test_compile_error_reports_command_and_compiler_output(tmp_path):
    src = tmp_path / "bad.cc"
    src.write_text("int main() { return undefined_thing; }\n")
    options = library.BuildOptions(sources=[str(src)], extra_compile_args=["-fPIC"])
    with pytest.raises(library.BuildError) as info:
        library.compile_library(str(tmp_path / "x.so"), options, str(tmp_path), jobs=1)
    assert "compiling" in str(info.value) and "undefined_thing" in str(info.value)


def test_missing_compiler_names_the_package_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    options = library.BuildOptions(sources=[_tiny_source(tmp_path)])
    with pytest.raises(library.ToolMissingError) as info:
        library.compile_library(str(tmp_path / "x.so"), options, str(tmp_path))
    message = str(info.value)
    assert "no C++ compiler" in message and "apt-get install g++" in message
    assert "gcc-c++" in message and "no-such-g++" in message


def test_bad_build_jobs_is_named(monkeypatch):
    monkeypatch.setenv("TFRING_BUILD_JOBS", "many")
    with pytest.raises(library.BuildError, match="TFRING_BUILD_JOBS='many'"):
        library.build_jobs()


def test_cache_entry_follows_tf_version_sources_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TFRING_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "tf_ops"), root / "tf_ops")
    a = cache.cache_entry("2.16.2", str(root))
    assert a.startswith(str(tmp_path / "cache") + os.sep)
    assert os.path.basename(a).startswith("tf2.16.2-")
    assert cache.cache_entry("2.16.2", str(root)) == a
    assert cache.cache_entry("2.21.0", str(root)) != a
    assert cache.cache_entry("2.16.2", str(root), variant="cuda") != a
    (root / "tf_ops" / "common" / "common.h").write_text("// edited\n", encoding="utf-8")
    assert cache.cache_entry("2.16.2", str(root)) != a
    # Another compiler (here a wrapper that reports another version) gets
    # an entry of its own.
    wrapper = tmp_path / "other-c++"
    wrapper.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "other-c++ 99.1"; exit 0; }\n'
                       'exec g++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    b = cache.cache_entry("2.16.2", str(root))
    monkeypatch.delenv("CXX")
    assert b != cache.cache_entry("2.16.2", str(root))
    monkeypatch.delenv("TFRING_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == str(tmp_path / "xdg" / "tfring")


def test_extra_options_merge_and_reject_unknown_fields():
    base = library.BuildOptions(sources=["a.cc"], libraries=["mpi"])
    merged = base.merged({"sources": ["b.cc"], "libraries": ["nccl"],
                          "define_macros": [("TFRING_WITH_NCCL", None)]})
    assert merged.sources == ["a.cc", "b.cc"] and merged.libraries == ["mpi", "nccl"]
    assert merged.define_macros == [("TFRING_WITH_NCCL", None)]
    assert base.merged(None) is base
    with pytest.raises(library.BuildError, match="unknown build option"):
        base.merged({"sourcez": ["x.cc"]})


def test_installed_tf_version_matches_tensorflow():
    import tensorflow as tf
    assert cache.installed_tf_version() == tf.__version__


@pytest.mark.parametrize("record", ["another TF", "other sources"])
def test_loader_takes_the_cache_when_the_install_is_not_current(tmp_path, monkeypatch, record):
    """A packaged library built for another TF, or from other C++ sources
    than the package has now (an editable install after a C++ change), is
    not loaded: the cache entry for the running TF and sources is (found
    here without compiling: the entry is seeded with a real library file)."""
    import tensorflow as tf
    from tfring.common import loader
    monkeypatch.delenv("TFRING_LIBRARY", raising=False)
    monkeypatch.delenv("HOROVOD_LIBRARY", raising=False)
    monkeypatch.setenv("TFRING_CACHE_DIR", str(tmp_path))
    packaged = cache.packaged_library()
    if packaged is None:
        pytest.skip("no library installed next to the package")
    root = library.source_root()
    entry = cache.cache_entry(tf.__version__, root, library.build_variant(tf))
    current = {"TF_VERSION": tf.__version__, "SOURCE_DIGEST": library.source_digest(root)}
    monkeypatch.setattr(cache, "_packaged_build_info", lambda: current)
    assert loader.library_path() == packaged
    stale = dict(current, **({"TF_VERSION": "1.0.0"} if record == "another TF"
                             else {"SOURCE_DIGEST": "0" * 64}))
    monkeypatch.setattr(cache, "_packaged_build_info", lambda: stale)
    os.makedirs(entry)
    shutil.copy(packaged, os.path.join(entry, library.LIBRARY_NAME))
    assert loader.library_path() == os.path.join(entry, library.LIBRARY_NAME)


def test_wheel_carries_the_sources_and_no_library(tmp_path):
    """A build that sees no TensorFlow (as under pip's build isolation)
    compiles nothing and ships the C++ sources as package data."""
    env = dict(os.environ, TFRING_SKIP_INSTALL_BUILD="1")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), ROOT], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-5000:]
    wheels = list(tmp_path.glob("tfring-*.whl"))
    assert len(wheels) == 1 and wheels[0].name.endswith("py3-none-any.whl"), wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    for rel in library.source_files(ROOT):
        assert f"tfring/_csrc/{rel}" in names, rel
    assert "tfring/build/library.py" in names and "tfring/build/cache.py" in names
    assert not [n for n in names if n.endswith(".so") or n.endswith("_build_info.py")]
    metadata = zipfile.ZipFile(wheels[0]).read(
        [n for n in names if n.endswith("METADATA")][0]).decode()
    assert "Requires-Dist: pybind11" in metadata


def test_unit_test_sources_are_library_sources():
    # The C++ test wrappers compile from unit_tests.UNIT_TEST_SOURCES: a file
    # moved or split in the core must be renamed there, not left dangling.
    units = set(library.translation_units(ROOT, mpi=True))
    for program, pieces in unit_tests.UNIT_TEST_SOURCES.items():
        own, *rest = unit_tests.unit_test_sources(program, ROOT)
        assert os.path.isfile(own), program
        for path in rest:
            assert os.path.relpath(path, ROOT) in units, f"{program} links {path}"


def _bazel_globs(build, name):
    # The patterns of a `NAME = [...]` list in tf_ops/BUILD.
    match = re.search(name + r" = \[(.*?)\]", build, re.S)
    return re.findall(r'"([^"]+)"', match.group(1))


def _bazel_glob_matches(path, pattern):
    # Bazel's "**/" spans any number of folders, "*" stays within one.
    regex, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.fullmatch(regex, path) is not None


def test_setup_and_bazel_compile_the_same_core():
    # tf_ops/BUILD globs common/**/*.cc into :core minus MPI_SRCS, which go
    # to :mpi; setup.py walks the tree and leaves out what is_mpi_source
    # names when built without MPI. Both must pick the same files.
    with open(os.path.join(ROOT, "tf_ops", "BUILD")) as f:
        mpi_globs = _bazel_globs(f.read(), "MPI_SRCS")
    common = os.path.join("tf_ops", "common", "")
    on_disk = [os.path.relpath(os.path.join(d, n), os.path.join(ROOT, "tf_ops"))
               for d, _, names in os.walk(os.path.join(ROOT, common)) for n in names
               if n.endswith(".cc")]
    setup_all = {f[len("tf_ops/"):] for f in library.translation_units(ROOT, mpi=True)
                 if f.startswith(common)}
    setup_core = {f[len("tf_ops/"):] for f in library.translation_units(ROOT, mpi=False)
                  if f.startswith(common)}
    bazel_mpi = {f for f in on_disk if any(_bazel_glob_matches(f, p) for p in mpi_globs)}
    bazel_core = {f for f in on_disk if _bazel_glob_matches(f, "common/**/*.cc")
                  and not _bazel_glob_matches(f, "common/tests/**/*")} - bazel_mpi
    assert bazel_core == setup_core
    assert bazel_mpi == setup_all - setup_core
    assert "common/operations.cc" in setup_core and "common/mpi/mpi_init.cc" in bazel_mpi


def test_setup_and_bazel_compile_the_same_tf_kernels():
    # tf_ops/BUILD's :tf_kernels globs tensorflow/**/*.cc (the kernels and
    # their XLA lowering in tensorflow/xla/); setup.py takes every .cc under
    # tf_ops/tensorflow. Both must pick the same files.
    with open(os.path.join(ROOT, "tf_ops", "BUILD")) as f:
        build = f.read()
    srcs = re.search(r'name = "tf_kernels",.*?srcs = glob\(\[(.*?)\]', build, re.S).group(1)
    patterns = [p for p in re.findall(r'"([^"]+)"', srcs) if p.endswith(".cc")]
    kernels = os.path.join(ROOT, "tf_ops", "tensorflow")
    on_disk = [os.path.relpath(os.path.join(d, n), os.path.join(ROOT, "tf_ops"))
               for d, _, names in os.walk(kernels) for n in names if n.endswith(".cc")]
    bazel = {f for f in on_disk if any(_bazel_glob_matches(f, p) for p in patterns)}
    setup = {f[len("tf_ops/"):] for f in library.translation_units(ROOT)
             if f.startswith(os.path.join("tf_ops", "tensorflow", ""))}
    assert bazel == setup
    assert {"tensorflow/kernels.cc", "tensorflow/xla/custom_call.cc"} <= setup


def _gpu_only(piece):
    # A core file that compiles to nothing without TFRING_WITH_NCCL.
    with open(os.path.join(ROOT, "tf_ops", "common", *piece.split("/"))) as f:
        first = next(line for line in f if line.startswith("#"))
    return first.startswith("#if") and "TFRING_WITH_NCCL" in first


def test_bazel_and_unit_tests_list_the_same_test_programs():
    # tfring.build.unit_tests is the one list of the C++ test programs and
    # what they link; Bazel's BUILD makes one cc_test per top-level
    # common/tests/*.cc (CORE_TESTS), links :mpi into MPI_TESTS, and
    # spells out the GPU files of the fake-NCCL tests (NCCL_TESTS). They
    # must agree.
    with open(os.path.join(ROOT, "tf_ops", "BUILD")) as f:
        build = f.read()
    tests_dir = os.path.join(ROOT, "tf_ops", "common", "tests")
    on_disk = sorted(n for n in os.listdir(tests_dir) if n.endswith(".cc"))
    listed = sorted(p for p in unit_tests.UNIT_TEST_SOURCES if "/" not in p)
    assert on_disk == listed, "tf_ops/common/tests/*.cc and unit_tests.UNIT_TEST_SOURCES differ"
    assert sorted(_bazel_globs(build, "MPI_TESTS")) == sorted(
        "common/tests/" + p for p in unit_tests.MPI_UNIT_TESTS)
    # Only the MPI programs link the MPI transport's files.
    for program, pieces in unit_tests.UNIT_TEST_SOURCES.items():
        mpi = [p for p in pieces if library.is_mpi_source(os.path.join("tf_ops", "common", p))]
        assert not mpi or program in unit_tests.MPI_UNIT_TESTS, (program, mpi)
    nccl_block = re.search(r"NCCL_TESTS = \{(.*?)\n\}", build, re.S).group(1)
    bazel_nccl = {}
    for src, gpu_srcs in re.findall(r'"([^"]+)": \[(.*?)\]', nccl_block, re.S):
        bazel_nccl[src[len("common/tests/"):]] = {
            s[len("common/"):] for s in re.findall(r'"([^"]+)"', gpu_srcs)}
    assert sorted(bazel_nccl) == sorted(unit_tests.NCCL_LOGIC_UNIT_TESTS)
    for program, gpu_srcs in bazel_nccl.items():
        # :core compiles the GPU files to nothing, so Bazel names each one
        # the program links.
        assert gpu_srcs == {p for p in unit_tests.UNIT_TEST_SOURCES[program]
                            if _gpu_only(p)}, program
    # Programs in a subfolder (no Bazel cc_test) exist too.
    for program in unit_tests.UNIT_TEST_SOURCES:
        assert os.path.isfile(os.path.join(tests_dir, *program.split("/"))), program
