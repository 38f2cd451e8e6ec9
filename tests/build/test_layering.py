"""Layering of the sources.

C++: the floors of tf_ops/common (SEAMS below): no include runs back up.
MPI lives only in tf_ops/common/mpi/ and the MPI data plane, so that a
build with TFRING_WITH_MPI=0 (which leaves exactly those files out) compiles,
and the core's start-up and planes stay transport-neutral.
(tests/common/test_core_cpp.py keeps TensorFlow out of the core the same way.)

Python: tfring's packages form layers, and a module imports (at module level
or inside a function) only from its own package, from the layers below it,
or the top package ``tfring`` itself (its version); a ``__main__`` module is
a program (``python -m``) on top of everything. From the bottom:

1. ``tfring._store`` (the wire, the rendezvous store, the elastic protocol),
   ``tfring.build`` (building the op library) and ``tfring.migrate`` (the
   source rewriter): nothing else of tfring.
2. ``tfring.common``: the core's handle, lifecycle, process sets and the
   elastic worker; no launcher, no framework binding.
3. ``tfring.runner``: tfringrun and its pieces (no TensorFlow).
   ``tfring.tensorflow`` and ``tfring.keras``, the framework bindings, on
   the same level, which may import each other but not the launcher;
   ``tfring.core``, the framework-neutral binding, beside them, importing
   neither. ``tfring.torch``, PyTorch's binding, over tfring.core; no other
   module of tfring imports torch (an extra, ``tfring[torch]``).
4. ``tfring.ray`` and ``tfring.spark``: launchers over other schedulers,
   built on tfring.runner (and their Keras pieces, Spark's estimator and
   Ray Train's report/checkpoint callback, on tfring.keras).

And no import cycle among tfring's modules: an import names the module it
reads (``from tfring.x import y`` reads tfring.x.y when that is a module,
else tfring.x), and following those edges never comes back.
"""
import ast
import os
import re

from support import ROOT
from tfring.build import library, unit_tests

TF_OPS = os.path.join(ROOT, "tf_ops")
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# Files allowed to include MPI besides the MPI transport's own: the C++ test
# programs that unit_tests.MPI_UNIT_TESTS names (built with mpicxx).
# The bindings reach every transport through transport/registry.h.
MPI_TESTS = {os.path.join("tf_ops", "common", "tests", *p.split("/"))
             for p in unit_tests.MPI_UNIT_TESTS}


def _is_mpi_include(rel, kind, name):
    """Whether an include of `name` from the file `rel` (relative to the
    root) brings in MPI: <mpi.h> or another header of MPI's, or a file of the
    MPI transport."""
    if kind == "<":
        return os.path.basename(name).startswith(("mpi", "mpio"))
    target = os.path.normpath(os.path.join(os.path.dirname(rel), name))
    return library.is_mpi_source(target)


def violations(root):
    """(file, line number, include) for every MPI include outside the MPI
    transport under root/tf_ops."""
    found = []
    for dirpath, _, filenames in os.walk(os.path.join(root, "tf_ops")):
        for name in sorted(filenames):
            if not name.endswith((".cc", ".h", ".cu")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if library.is_mpi_source(rel) or rel in MPI_TESTS:
                continue
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = _INCLUDE.match(line)
                    if m and _is_mpi_include(rel, m.group(1), m.group(2)):
                        found.append((rel, number, line.strip()))
    return found


def test_only_the_mpi_transport_includes_mpi():
    assert violations(ROOT) == []


def test_the_mpi_transport_is_what_a_build_without_mpi_leaves_out():
    with_mpi = set(library.translation_units(ROOT, mpi=True))
    without = set(library.translation_units(ROOT, mpi=False))
    left_out = sorted(with_mpi - without)
    assert left_out and all(library.is_mpi_source(f) for f in left_out), left_out
    assert os.path.join("tf_ops", "common", "ops", "mpi_data_plane.cc") in left_out
    assert os.path.join("tf_ops", "common", "mpi", "mpi_init.cc") in left_out
    assert os.path.join("tf_ops", "common", "operations.cc") in without


def test_the_check_finds_mpi_includes(tmp_path):
    """The check itself: an MPI include anywhere else, directly or through a
    file of the MPI transport, is found, in the Python module too (even
    behind `#if TFRING_WITH_MPI`: the bindings use transport/registry.h)."""
    common = tmp_path / "tf_ops" / "common"
    (common / "ops").mkdir(parents=True)
    (common / "mpi").mkdir()
    (common / "mpi" / "mpi_backend.h").write_text('#include <mpi.h>\n')
    (common / "ops" / "mpi_data_plane.h").write_text('#include <mpi.h>\n')
    (common / "operations.cc").write_text('#include "mpi/mpi_backend.h"\n')
    (common / "ops" / "ring_data_plane.cc").write_text('#include "mpi_data_plane.h"\n')
    (common / "ops" / "shm_data_plane.cc").write_text('#  include <mpi.h>\n')
    (tmp_path / "tf_ops" / "python_module.cc").write_text(
        '#if TFRING_WITH_MPI\n#include "common/mpi/mpi_init.h"\n#endif\n'
        '#include "common/mpi/mpi_backend.h"\n')
    found = sorted((f, n) for f, n, _ in violations(str(tmp_path)))
    assert found == [
        (os.path.join("tf_ops", "common", "operations.cc"), 1),
        (os.path.join("tf_ops", "common", "ops", "ring_data_plane.cc"), 1),
        (os.path.join("tf_ops", "common", "ops", "shm_data_plane.cc"), 1),
        (os.path.join("tf_ops", "python_module.cc"), 2),
        (os.path.join("tf_ops", "python_module.cc"), 4),
    ], found


# The floors of tf_ops/common (tests/ aside), from the bottom; a file
# includes only files of its own floor or below:
# 0. the seams: the types every layer shares (common, status, config,
#    logging, reduction, the peer monitor, mapped buffers), the interfaces the core drives
#    (the DataPlane, the Executor over its fusion buffer, device events, the
#    GPU hooks) and the one it starts (Backend);
# 1. what implements them: the data planes (ops/) and the transports
#    (transport/, and MPI's context and communicator in mpi/);
# 2. the core: queue, negotiation, speculation, execution, the loop,
#    lifecycle and operations.h;
# 3. the assembly room, where a transport is joined with the core into a
#    Backend: backends/ (TCP) and MPI's backend, controller and
#    registration (mpi/, where MPI must stay).
SEAMS = {
    "common.h", "common.cc", "status.h", "config.h", "config.cc", "logging.h", "logging.cc",
    "reduction.h", "reduction.cc", "peer_monitor.h", "peer_monitor.cc", "device_event.h",
    "fusion_buffer.h", "fusion_buffer.cc", "executor.h", "executor.cc", "gpu_support.h",
    "gpu_support.cc", "backend.h", "mapped_buffer.h", "ops/data_plane.h"}
MPI_ASSEMBLY = {"mpi/mpi_backend.h", "mpi/mpi_backend.cc", "mpi/mpi_controller.h",
                "mpi/mpi_controller.cc", "mpi/mpi_init.cc"}
FLOOR_NAMES = ["the seams", "the planes and transports", "the core", "the assembly room"]


def core_floor(rel):
    """The floor (0-3, above) of a file given relative to tf_ops/common."""
    rel = rel.replace(os.sep, "/")
    if rel in SEAMS:
        return 0
    if rel.startswith("backends/") or rel in MPI_ASSEMBLY:
        return 3
    if rel.startswith(("ops/", "transport/", "mpi/")):
        return 1
    return 2


def core_floor_violations(root):
    """"file:line -> target" for every include in tf_ops/common (tests/
    aside) that reaches a higher floor or leaves tf_ops/common."""
    common = os.path.join(root, "tf_ops", "common")
    found = []
    for dirpath, dirnames, filenames in os.walk(common):
        dirnames[:] = [d for d in dirnames if os.path.relpath(os.path.join(dirpath, d), common)
                       != "tests"]
        for name in sorted(filenames):
            if not name.endswith((".cc", ".h", ".cu")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), common)
            with open(os.path.join(common, rel), encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    m = _INCLUDE.match(line)
                    if not m or m.group(1) != '"':
                        continue
                    target = os.path.normpath(os.path.join(os.path.dirname(rel), m.group(2)))
                    if target.startswith(".."):
                        found.append(f"{rel}:{number} -> {m.group(2)} (outside tf_ops/common)")
                    elif not os.path.exists(os.path.join(common, target)):
                        continue  # a generated or system header under quotes
                    elif core_floor(target) > core_floor(rel):
                        found.append(f"{rel}:{number} -> {target} "
                                     f"({FLOOR_NAMES[core_floor(rel)]} reaching up to "
                                     f"{FLOOR_NAMES[core_floor(target)]})")
    return found


def test_no_include_in_the_core_runs_back_up_a_floor():
    assert core_floor_violations(ROOT) == []


def test_the_floor_check_finds_includes_that_run_up(tmp_path):
    common = tmp_path / "tf_ops" / "common"
    for d in ("ops", "transport/tcp", "backends", "mpi", "tests"):
        (common / d).mkdir(parents=True)
    files = {
        "status.h": "",
        "controller.h": '#include "status.h"\n',
        "ops/data_plane.h": '#include "../status.h"\n',
        "ops/ring_data_plane.cc": '#include "data_plane.h"\n#include "../controller.h"\n',
        "transport/tcp/world.cc": '#include "../../backends/tcp_backend.h"\n',
        "backends/tcp_backend.h": '#include "../controller.h"\n#include "../transport/tcp/world.h"\n',
        "transport/tcp/world.h": "",
        "mpi/mpi_context.h": '#include "mpi_backend.h"\n',
        "mpi/mpi_backend.h": '#include "../controller.h"\n',
        "status.cc": '#include "../tensorflow/kernels.h"\n',
        "tests/check.h": '#include "../backends/tcp_backend.h"\n',
    }
    for rel, text in files.items():
        (common / rel).write_text(text)
    found = sorted(v.split(" ->")[0] for v in core_floor_violations(str(tmp_path)))
    assert found == ["mpi/mpi_context.h:1", "ops/ring_data_plane.cc:2", "status.cc:1",
                     "transport/tcp/world.cc:1"], found


# The packages each package of tfring may import from, besides itself and
# the top package (see the docstring).
_BOTTOM = {"_store", "build", "migrate"}
ALLOWED = {
    "_store": set(), "build": set(), "migrate": set(),
    "common": {"_store", "build"},
    "runner": {"_store", "build", "common"},
    "core": {"_store", "build", "common"},
    "torch": {"_store", "build", "common", "core"},
    "tensorflow": {"_store", "build", "common", "keras"},
    "keras": {"_store", "build", "common", "tensorflow"},
    "ray": {"_store", "build", "common", "runner", "tensorflow", "keras"},
    "spark": {"_store", "build", "common", "runner", "tensorflow", "keras"},
}


def python_modules(root):
    """{module name: path} of every module under root/tfring, but the
    record an in-place build writes (tfring/_build_info.py, not a source)."""
    found = {}
    for dirpath, _, filenames in os.walk(os.path.join(root, "tfring")):
        for name in filenames:
            if name.endswith(".py") and name != "_build_info.py":
                path = os.path.join(dirpath, name)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _nearest(name, modules):
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root):
    """{module: {(imported module, line)}} over every import in tfring,
    function-level ones included; imports of other projects are left out."""
    modules = python_modules(root)
    graph = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [_nearest(a.name, modules) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules
                           else _nearest(base, modules) for a in node.names]
            else:
                continue
            edges |= {(t, node.lineno) for t in targets if t and t != module}
        graph[module] = edges
    return graph


def _layer(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the top package


def layer_violations(root):
    """"module:line imports other" for each import that reaches up a layer."""
    found = []
    for module, edges in sorted(import_graph(root).items()):
        own = _layer(module)
        if own is None or module.endswith(".__main__"):
            continue
        for target, line in sorted(edges):
            other = _layer(target)
            if other is not None and other != own and other not in ALLOWED.get(own, ()):
                found.append(f"{module}:{line} imports {target}")
    return found


def import_cycles(root):
    """One cycle [a, b, ..., a] for each group of modules that import each
    other (a strongly connected component of the import graph)."""
    graph = {m: sorted({t for t, _ in edges}) for m, edges in import_graph(root).items()}
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm; tfring's graph is shallow enough to recurse
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for group in groups:
        start = min(group)
        paths, seen = {start: [start]}, {start}
        todo = [start]
        while todo:  # the shortest way from start back to itself inside the group
            v = todo.pop(0)
            for w in graph[v]:
                if w == start:
                    todo = []
                    cycles.append(paths[v] + [start])
                    break
                if w in group and w not in seen:
                    seen.add(w)
                    paths[w] = paths[v] + [w]
                    todo.append(w)
    return sorted(cycles)


def test_each_python_layer_imports_only_the_layers_below():
    assert set(ALLOWED) == {_layer(m) for m in python_modules(ROOT)} - {None}, \
        "a new package of tfring needs its place in ALLOWED (and the docstring)"
    assert layer_violations(ROOT) == []


def torch_importers(root):
    """"module:line" for each import of torch outside tfring.torch."""
    found = []
    for module, path in sorted(python_modules(root).items()):
        if module == "tfring.torch" or module.startswith("tfring.torch."):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "torch" or n.startswith("torch.") for n in names):
                found.append(f"{module}:{node.lineno}")
    return found


def test_only_tfring_torch_imports_torch(tmp_path):
    assert torch_importers(ROOT) == []
    (tmp_path / "tfring" / "core").mkdir(parents=True)
    (tmp_path / "tfring" / "core" / "x.py").write_text("def f():\n    import torch.nn\n")
    (tmp_path / "tfring" / "torch").mkdir()
    (tmp_path / "tfring" / "torch" / "y.py").write_text("import torch\n")
    assert torch_importers(str(tmp_path)) == ["tfring.core.x:2"]


def test_no_import_cycle_among_tfring_modules():
    cycles = import_cycles(ROOT)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_python_checks_find_cycles_and_layer_breaks(tmp_path):
    """The checks themselves, on a made-up tfring: a cycle through a
    function-level and a relative import, and common reaching up to runner
    (which its __main__ may)."""
    files = {
        "tfring/__init__.py": "",
        "tfring/common/__init__.py": "",
        "tfring/common/basics.py": "from tfring.common import process_sets\n",
        "tfring/common/process_sets.py": "def f():\n    from . import basics\n",
        "tfring/common/elastic.py": "import os\nfrom tfring.runner.wire import frame\n",
        "tfring/common/__main__.py": "from tfring.runner import launch\n",
        "tfring/runner/__init__.py": "from tfring.runner import launch\n",
        "tfring/runner/launch.py": "import tfring.runner.wire\n",
        "tfring/runner/wire.py": "from tfring.common import basics\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert import_cycles(str(tmp_path)) == [
        ["tfring.common.basics", "tfring.common.process_sets", "tfring.common.basics"]]
    assert layer_violations(str(tmp_path)) == ["tfring.common.elastic:2 imports tfring.runner.wire"]
