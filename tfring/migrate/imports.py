"""Rewriting Horovod's imports (and the ``horovod`` name) to tfring's.

Handled: ``import horovod.X as hvd``, ``import horovod.X`` (then every use of
the name ``horovod`` becomes ``tfring``, so ``horovod.run(...)`` becomes
``tfring.run(...)``), and ``from horovod.X import Y``, for the modules of
:data:`MODULES`. Anything else under ``horovod`` (``horovod.torch``,
``horovod.mxnet``, ...) is reported and left alone: rewriting it to a tfring
module that does not exist would only move the error.
"""
import ast

from tfring.migrate.source import Edit, Finding, dotted_span

# Horovod module -> the tfring module a script should import instead.
MODULES = {
    "horovod": "tfring",
    "horovod.tensorflow": "tfring.tensorflow",
    "horovod.tensorflow.elastic": "tfring.tensorflow.elastic",
    "horovod.tensorflow.compression": "tfring.tensorflow.compression",
    "horovod.tensorflow.keras": "tfring.keras",
    "horovod.tensorflow.keras.callbacks": "tfring.keras.callbacks",
    "horovod.tensorflow.keras.elastic": "tfring.keras.elastic",
    # Horovod's standalone-Keras binding: the same API over Keras 2; tfring's
    # Keras module serves Keras 3 (and tf_keras).
    "horovod.keras": "tfring.keras",
    "horovod.keras.callbacks": "tfring.keras.callbacks",
    "horovod.keras.elastic": "tfring.keras.elastic",
    "horovod.spark": "tfring.spark",
    "horovod.spark.keras": "tfring.spark.keras",
    "horovod.ray": "tfring.ray",
}

_NOT_HANDLED = {
    "horovod.torch": "tfring has no PyTorch binding this tool can target yet; keep this "
                     "file on Horovod, or port it by hand",
    "horovod.mxnet": "tfring has no MXNet binding; keep this file on Horovod",
}


def _unhandled_fix(module):
    for prefix, fix in _NOT_HANDLED.items():
        if module == prefix or module.startswith(prefix + "."):
            return fix
    return "tfring has no counterpart of this module; port this code by hand"


def _is_horovod(module):
    return module == "horovod" or module.startswith("horovod.")


def rewrite_imports(source):
    """Edits and findings that move ``source`` from Horovod's modules to tfring's.

    Args:
        source: a :class:`tfring.migrate.source.Source`.

    Returns:
        (edits, findings): lists of :class:`Edit` and :class:`Finding`.
    """
    edits, findings = [], []
    plain = []  # unaliased "import horovod.X": they bind the name "horovod"
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _is_horovod(alias.name):
                    continue
                if alias.asname is None:
                    plain.append(alias)
                elif alias.name in MODULES:
                    start, end = dotted_span(source, alias, alias.name)
                    edits.append(Edit(start, end, MODULES[alias.name]))
                    findings.append(Finding(alias.lineno, f"import {alias.name} -> "
                                            f"{MODULES[alias.name]}", fixed=True))
                else:
                    findings.append(Finding(alias.lineno, f"import {alias.name} is not handled",
                                            _unhandled_fix(alias.name)))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level \
                and _is_horovod(node.module):
            # "from horovod import torch" names a module in the imported names.
            targets = [f"{node.module}.{a.name}" for a in node.names]
            bad = [t for t in [node.module, *targets]
                   if any(t == p or t.startswith(p + ".") for p in _NOT_HANDLED)]
            if node.module in MODULES and not bad:
                start, end = dotted_span(source, node, node.module, skip=1)
                edits.append(Edit(start, end, MODULES[node.module]))
                findings.append(Finding(node.lineno, f"from {node.module} import -> from "
                                        f"{MODULES[node.module]} import", fixed=True))
            else:
                name = bad[0] if bad else node.module
                findings.append(Finding(node.lineno, f"from {node.module} import ... is not "
                                        "handled", _unhandled_fix(name)))
    if not plain:
        return edits, findings
    unhandled = [a for a in plain if a.name not in MODULES]
    if unhandled:
        # The name "horovod" would then mean two packages at once: leave all of it.
        for alias in plain:
            if alias in unhandled:
                findings.append(Finding(alias.lineno, f"import {alias.name} is not handled",
                                        _unhandled_fix(alias.name)))
            else:
                findings.append(Finding(
                    alias.lineno, f"import {alias.name} left alone: the name horovod is also "
                    "bound to a module this tool does not handle",
                    f"import {MODULES[alias.name]} under a name of its own and rename its uses"))
        return edits, findings
    for alias in plain:
        start, end = dotted_span(source, alias, alias.name)
        # Same structure under tfring: tfring.tensorflow.keras is tfring.keras.
        edits.append(Edit(start, end, "tfring" + alias.name[len("horovod"):]))
        findings.append(Finding(alias.lineno, f"import {alias.name} -> import "
                                f"tfring{alias.name[len('horovod'):]}", fixed=True))
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Name) and node.id == "horovod":
            edits.append(Edit(source.start(node), source.end(node), "tfring"))
            if isinstance(node.ctx, ast.Load):
                findings.append(Finding(node.lineno, "horovod -> tfring", fixed=True))
    return edits, findings
