"""`local_config_tf`: the pip-installed TensorFlow, pybind11, Python and MPICH, for Bazel.

tfring is built against the TensorFlow that is installed (design.md section 3),
exactly like setup.py does it. This repository rule runs a Python interpreter
once, asks it where those live, symlinks them into the external repository and
writes a BUILD file with one cc_library per dependency:

  @local_config_tf//:tf_headers              TF headers (+ Eigen, absl, protobuf, ...)
  @local_config_tf//:libtensorflow_framework libtensorflow_framework.so.2
  @local_config_tf//:tensorflow              both of the above
  @local_config_tf//:tensorflow_xla          libtensorflow_cc.so.2 (TF2XLA, XLA's builder
                                             and FFI) and the hash headers XLA's include,
                                             for tf_ops/tensorflow/xla/ (empty without it)
  @local_config_tf//:pybind11                pybind11 headers
  @local_config_tf//:python_headers          Python.h (no libpython: extension module)
  @local_config_tf//:mpi                     mpi.h + -l:libmpi.so.12 (the `mpich` wheel)

and `@local_config_tf//:build_defs.bzl` with TF_COPTS (the non -I part of
tf.sysconfig.get_compile_flags()), TF_VERSION and MPI_LIB_DIR.

Environment (a change re-runs the rule):
  PYTHON_BIN_PATH  interpreter to ask (default: python3 on PATH)
  TFRING_MPI_PREFIX  directory with include/mpi.h and lib/libmpi.so*
                   (default: sysconfig.get_paths()["data"], the mpich wheel)

After upgrading TensorFlow in the same environment, run `bazel sync --configure`
(or `bazel clean --expunge`) so the new headers and flags are picked up.
"""

_PYTHON_BIN_PATH = "PYTHON_BIN_PATH"
_MPI_PREFIX = "TFRING_MPI_PREFIX"

# Prints one "key<TAB>value" line per fact; list-valued keys repeat.
_PROBE = """
import os, sys, sysconfig
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
def out(key, value):
    sys.stdout.write("%s\\t%s\\n" % (key, value))
try:
    import tensorflow as tf
except Exception as exc:
    sys.stderr.write("cannot import tensorflow: %r\\n" % (exc,))
    sys.exit(3)
try:
    import pybind11
except Exception as exc:
    sys.stderr.write("cannot import pybind11: %r\\n" % (exc,))
    sys.exit(4)
out("python", sys.executable)
out("tf_version", tf.__version__)
for flag in tf.sysconfig.get_compile_flags():
    out("tf_compile_flag", flag)
for flag in tf.sysconfig.get_link_flags():
    out("tf_link_flag", flag)
out("pybind11_include", pybind11.get_include())
paths = sysconfig.get_paths()
out("python_include", paths["include"])
out("data", paths["data"])
"""

def _fail(msg):
    fail("\n[local_config_tf] " + msg + "\n")

def _find_python(rctx):
    python = rctx.os.environ.get(_PYTHON_BIN_PATH, "").strip()
    if python:
        if not python.startswith("/"):
            found = rctx.which(python)
            if found == None:
                _fail("%s=%s is not on PATH." % (_PYTHON_BIN_PATH, python))
            return str(found)
        return python
    for name in ["python3", "python"]:
        found = rctx.which(name)
        if found != None:
            return str(found)
    _fail("No python3 on PATH. Activate the environment that has tensorflow, " +
          "pybind11 and mpich installed, or set %s." % _PYTHON_BIN_PATH)
    return None

def _probe(rctx, python):
    result = rctx.execute([python, "-c", _PROBE], timeout = 300)
    if result.return_code != 0:
        _fail(("Running %s to locate TensorFlow/pybind11 failed (exit %d):\n%s\n" +
               "Install them into that environment (pip install tensorflow pybind11 mpich) " +
               "or point %s at an interpreter that has them.") %
              (python, result.return_code, result.stderr, _PYTHON_BIN_PATH))
    facts = {}
    for line in result.stdout.splitlines():
        if "\t" not in line:
            continue  # stray output from imports
        key, value = line.split("\t", 1)
        facts.setdefault(key, []).append(value)
    return facts

def _one(facts, key):
    values = facts.get(key, [])
    if len(values) != 1:
        _fail("The Python probe did not report %s (got %s)." % (key, values))
    return values[0]

def _split_compile_flags(flags):
    """-I<dir> flags become the header directory; the rest are copts."""
    include_dirs = []
    copts = []
    for flag in flags:
        if flag.startswith("-I"):
            include_dirs.append(flag[2:])
        else:
            copts.append(flag)
    return include_dirs, copts

def _framework_library(link_flags):
    """Returns the absolute path of libtensorflow_framework from `-L<dir> -l:<name>`."""
    lib_dirs = []
    names = []
    for flag in link_flags:
        if flag.startswith("-L"):
            lib_dirs.append(flag[2:])
        elif flag.startswith("-l:"):
            names.append(flag[3:])
        elif flag.startswith("-l"):
            names.append("lib%s.so" % flag[2:])
    if len(lib_dirs) != 1 or len(names) != 1:
        _fail("Unexpected tf.sysconfig.get_link_flags(): %s" % link_flags)
    return lib_dirs[0], names[0]

def _require(rctx, path, what):
    if not rctx.path(path).exists:
        _fail("%s not found at %s" % (what, path))

def _starlark_list(items):
    return "[" + ", ".join(['"%s"' % i for i in items]) + "]"

def _tf_configure_impl(rctx):
    python = _find_python(rctx)
    facts = _probe(rctx, python)

    tf_version = _one(facts, "tf_version")
    include_dirs, tf_copts = _split_compile_flags(facts.get("tf_compile_flag", []))
    if len(include_dirs) != 1:
        _fail("Expected one -I in tf.sysconfig.get_compile_flags(), got %s" % include_dirs)
    tf_include = include_dirs[0]
    tf_lib_dir, tf_lib_name = _framework_library(facts.get("tf_link_flag", []))
    tf_lib = tf_lib_dir + "/" + tf_lib_name
    _require(rctx, tf_include + "/tensorflow/core/framework/op_kernel.h", "TensorFlow headers")
    _require(rctx, tf_lib, "libtensorflow_framework")

    pybind11_include = _one(facts, "pybind11_include")
    _require(rctx, pybind11_include + "/pybind11/pybind11.h", "pybind11 headers")
    python_include = _one(facts, "python_include")
    _require(rctx, python_include + "/Python.h", "Python headers (Python.h; install python3-dev)")

    mpi_prefix = rctx.os.environ.get(_MPI_PREFIX, "").strip() or _one(facts, "data")
    mpi_include = mpi_prefix + "/include"
    mpi_lib_dir = mpi_prefix + "/lib"
    _require(rctx, mpi_include + "/mpi.h",
             "mpi.h (pip install mpich, or set %s)" % _MPI_PREFIX)
    mpi_lib_name = None
    for candidate in ["libmpi.so.12", "libmpi.so"]:
        if rctx.path(mpi_lib_dir + "/" + candidate).exists:
            mpi_lib_name = candidate
            break
    if mpi_lib_name == None:
        _fail("libmpi.so.12 not found in %s (pip install mpich, or set %s)" %
              (mpi_lib_dir, _MPI_PREFIX))

    # Symlink everything into the repository, so the cc_library targets below
    # declare the real headers and Bazel tracks them as inputs.
    rctx.symlink(tf_include, "tf/include")
    rctx.symlink(tf_lib, "tf/lib/" + tf_lib_name)
    # The XLA lowering's library; a wheel without it builds no XLA kernels
    # (tf_ops/tensorflow/xla/xla_support.h), as setup.py does.
    tf_xla_lib = tf_lib_dir + "/libtensorflow_cc.so.2"
    tf_xla_srcs = "[]"
    if rctx.path(tf_xla_lib).exists:
        rctx.symlink(tf_xla_lib, "tf/lib/libtensorflow_cc.so.2")
        tf_xla_srcs = '["tf/lib/libtensorflow_cc.so.2"]'
    rctx.symlink(pybind11_include, "pybind11/include")
    rctx.symlink(python_include, "python/include")
    for header in rctx.path(mpi_include).readdir():
        if header.basename.endswith(".h"):
            rctx.symlink(header, "mpi/include/" + header.basename)

    rctx.template(
        "BUILD",
        rctx.attr._build_tpl,
        substitutions = {
            "%{TF_LIB}": "tf/lib/" + tf_lib_name,
            "%{TF_XLA_SRCS}": tf_xla_srcs,
            "%{MPI_LIB}": mpi_lib_name,
            "%{MPI_LIB_DIR}": mpi_lib_dir,
        },
    )
    rctx.file("build_defs.bzl", "\n".join([
        '"""Generated by //third_party:tf_configure.bzl from %s."""' % python,
        "",
        "# tf.sysconfig.get_compile_flags() without the -I flag.",
        "TF_COPTS = %s" % _starlark_list(tf_copts),
        'TF_VERSION = "%s"' % tf_version,
        'PYTHON_BIN = "%s"' % python,
        'MPI_LIB_DIR = "%s"' % mpi_lib_dir,
        "",
    ]))

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    attrs = {
        "_build_tpl": attr.label(default = Label("//third_party:local_config_tf.BUILD.tpl")),
    },
    environ = [_PYTHON_BIN_PATH, _MPI_PREFIX, "PATH"],
    local = True,
    configure = True,
)
