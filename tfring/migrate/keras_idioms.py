"""Keras 2 idioms that Keras 3 breaks: the mechanical fixes, and reports of the rest.

Each rule here was checked against Keras 3 (3.15, TF 2.21): the old form
raises (or, for ``decay=``, is silently ignored), the new form works.

Whether an expression is a Keras optimizer is decided from the file alone
(:class:`_Optimizers`): a constructor from ``tf.keras.optimizers`` (or
``keras.optimizers``, ``tf.optimizers``, their ``legacy``/``experimental``
submodules, names imported from them), ``hvd.DistributedOptimizer`` of one,
``model.optimizer``, or a name every assignment of which is one of these.
``.lr`` and ``.variables()`` are rewritten only on such expressions: a
user's own ``args.lr`` is never touched, and ``x.variables()`` on anything
else is reported instead (a ``tf.compat.v1.train`` optimizer's
``variables()`` is still a method, and stays).
"""
import ast

from tfring.migrate.source import (Edit, Finding, dotted_span, qualified_name,
                                   remove_arguments)

# The optimizer classes of keras.optimizers in Keras 3 (tests check each exists).
OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "Adamax", "Ftrl",
                        "Nadam", "RMSprop", "Lion", "Lamb"})

# Paths that are Keras under another name, longest first.
_KERAS_PREFIXES = ("tensorflow.compat.v1.keras", "tensorflow.compat.v2.keras",
                   "tensorflow.python.keras", "tensorflow.keras", "keras")

# Keras 2 optimizer internals that Keras 3 optimizers never call.
_OPTIMIZER_INTERNALS = {
    "get_gradients": "Keras 3 computes gradients in the train step; override "
                     "apply_gradients(grads_and_vars) (or use hvd.DistributedOptimizer)",
    "_aggregate_gradients": "override apply_gradients(grads_and_vars) and change the "
                            "gradients there",
    "get_updates": "implement build(variables) and update_step(gradient, variable, "
                   "learning_rate)",
    "_create_slots": "create slot variables in build(variables) with add_variable_from_reference",
    "_resource_apply_dense": "implement update_step(gradient, variable, learning_rate)",
    "_resource_apply_sparse": "implement update_step(gradient, variable, learning_rate)",
    "_prepare_local": "compute per-step values in update_step",
}

_SESSION = ("Keras 3 has no session", "remove it: TF2 runs eagerly; configure devices with "
            "tf.config (set_visible_devices, set_memory_growth); TF1 graph code uses "
            "tf.compat.v1.Session directly")
_BACKEND_REPORTS = {
    "keras.backend.get_session": _SESSION,
    "keras.backend.set_session": _SESSION,
    "keras.backend.learning_phase": ("Keras 3 has no global learning phase",
                                     "pass training=True/False when calling the model"),
    "keras.backend.set_learning_phase": ("Keras 3 has no global learning phase",
                                         "pass training=True/False when calling the model"),
    "keras.utils.multi_gpu_model": ("Keras 3 has no multi_gpu_model",
                                    "train data-parallel with tfring instead"),
}

_REMOVED_COMPILE_ARGS = ("target_tensors", "distribute", "sample_weight_mode")
_LOADER_ARGS = ("workers", "use_multiprocessing", "max_queue_size")
_GENERATOR_METHODS = {"fit_generator": "fit", "evaluate_generator": "evaluate",
                      "predict_generator": "predict"}


def keras_path(qualified):
    """``qualified`` with any Keras alias (``tensorflow.keras``, ``tf.optimizers``,
    ...) spelled ``keras``; None when it is not a Keras path."""
    if qualified is None:
        return None
    if qualified == "tensorflow.optimizers" or qualified.startswith("tensorflow.optimizers."):
        return "keras" + qualified[len("tensorflow"):]
    for prefix in _KERAS_PREFIXES:
        if qualified == prefix or qualified.startswith(prefix + "."):
            return "keras" + qualified[len(prefix):]
    return None


def _optimizer_class(path):
    """The class name when ``path`` is a Keras optimizer class, else None."""
    if path is None:
        return None
    parts = path.split(".")
    if parts[:2] == ["keras", "optimizers"] and (
            len(parts) == 3 or (len(parts) == 4 and parts[2] in ("legacy", "experimental"))) \
            and parts[-1] in OPTIMIZERS:
        return parts[-1]
    return None


class _Optimizers:
    """Which expressions of one file are Keras (or TF1) optimizers."""

    def __init__(self, tree, aliases):
        self.aliases = aliases
        self.assigned = {}  # name -> [value node, or None when bound some other way]
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                self._bind(node.target, node.value)
            elif isinstance(node, ast.arg):
                self.assigned.setdefault(node.arg, []).append(None)
            elif isinstance(node, (ast.For, ast.comprehension)):
                self._bind(node.target, None)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self._bind(node.optional_vars, None)

    def _bind(self, target, value):
        if isinstance(target, ast.Name):
            self.assigned.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._bind(element, None)

    def kind(self, node, visiting=frozenset()):
        """"keras", "tf1" or None (unknown) for the expression ``node``."""
        if isinstance(node, ast.Call):
            qualified = qualified_name(node.func, self.aliases)
            path = keras_path(qualified)
            if _optimizer_class(path) or path == "keras.optimizers.get":
                return "keras"
            if qualified and qualified.startswith(("tensorflow.compat.v1.train.",
                                                   "tensorflow.train.")) \
                    and qualified.endswith("Optimizer"):
                return "tf1"
            if qualified and qualified.rsplit(".", 1)[-1] == "DistributedOptimizer":
                wrapped = node.args[0] if node.args else next(
                    (k.value for k in node.keywords if k.arg == "optimizer"), None)
                return self.kind(wrapped, visiting) if wrapped is not None else None
            return None
        if isinstance(node, ast.Attribute) and node.attr == "optimizer":
            owner = node.value
            if (isinstance(owner, ast.Name) and "model" in owner.id.lower()) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "model"):
                return "keras"
            return None
        if isinstance(node, ast.Name):
            if node.id in visiting:
                return "cycle"
            values = self.assigned.get(node.id)
            if not values or None in values:
                return None
            kinds = {self.kind(v, visiting | {node.id}) for v in values} - {"cycle"}
            return kinds.pop() if len(kinds) == 1 else None
        return None


def _looks_like_optimizer(node):
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name == "opt" or "optim" in name.lower()


def _string_tail(node):
    """The constant end of a path argument, else None: a string, an
    f-string, ``"...".format(...)`` or ``os.path.join(..., last)``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[-1],
                                                                       ast.Constant):
        return node.values[-1].value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            return _string_tail(node.func.value)
        if node.func.attr == "join" and node.args and not isinstance(node.func.value,
                                                                     ast.Constant):
            return _string_tail(node.args[-1])
    return None


class _Rules:
    def __init__(self, source, aliases):
        self.source = source
        self.aliases = aliases
        self.optimizers = _Optimizers(source.tree, aliases)
        self.edits, self.findings = [], []

    def fixed(self, node, message, *edits):
        self.edits.extend(edits)
        self.findings.append(Finding(node.lineno, message, fixed=True))

    def manual(self, node, message, fix):
        self.findings.append(Finding(node.lineno, message, fix))

    def path(self, node):
        return keras_path(qualified_name(node, self.aliases))

    def run(self):
        for node in ast.walk(self.source.tree):
            if isinstance(node, ast.Call):
                self.call(node)
            elif isinstance(node, ast.Attribute):
                self.attribute(node)
            elif isinstance(node, ast.ClassDef):
                self.class_def(node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self.legacy_import(node)
        return self.edits, self.findings

    # -- calls -----------------------------------------------------------------
    def call(self, node):
        func = node.func
        path = self.path(func)
        keywords = {k.arg: k for k in node.keywords if k.arg}
        method = func.attr if isinstance(func, ast.Attribute) else None
        if method == "compile":
            if "experimental_run_tf_function" in keywords:
                self.fixed(node, "compile(experimental_run_tf_function=...) removed (Keras 3 "
                           "has no such argument)",
                           *remove_arguments(self.source, node,
                                             [keywords["experimental_run_tf_function"]]))
            for name in _REMOVED_COMPILE_ARGS:
                if name in keywords:
                    self.manual(node, f"compile({name}=...) is not a Keras 3 argument",
                                "remove it (and feed targets/sample weights to fit)")
        if _optimizer_class(path):
            self.optimizer_constructor(node, keywords)
        if path == "keras.backend.set_value" and len(node.args) == 2 and not keywords:
            self.set_value(node)
        if path in _BACKEND_REPORTS:
            message, fix = _BACKEND_REPORTS[path]
            self.manual(node, message, fix)
        if path == "keras.layers.BatchNormalization" and "fused" in keywords:
            self.fixed(node, "BatchNormalization(fused=...) removed (Keras 3 has no fused "
                       "batch norm)", *remove_arguments(self.source, node, [keywords["fused"]]))
        if method in _GENERATOR_METHODS:
            start = self.source.end(func) - len(method)
            self.fixed(node, f"{method}(...) -> {_GENERATOR_METHODS[method]}(...)",
                       Edit(start, start + len(method), _GENERATOR_METHODS[method]))
        if method in (*_GENERATOR_METHODS, *_GENERATOR_METHODS.values()):
            loader = [name for name in _LOADER_ARGS if name in keywords]
            if loader:
                self.fixed(node, f"{method}({'=..., '.join(loader)}=...) removed (in Keras 3 "
                           "they belong to a keras.utils.PyDataset)",
                           *remove_arguments(self.source, node, [keywords[n] for n in loader]))
        if method == "variables" and not node.args and not node.keywords:
            kind = self.optimizers.kind(func.value)
            if kind == "keras":
                self.fixed(node, "optimizer.variables() -> optimizer.variables (a list in "
                           "Keras 3)", Edit(self.source.end(func), self.source.end(node), ""))
            elif kind is None:
                self.manual(node, "variables() is a list, not a method, on Keras 3 "
                            "optimizers, models and layers (not rewritten: this tool cannot "
                            "tell what this object is)",
                            "write .variables without the call, unless it is a "
                            "tf.compat.v1.train optimizer")
        self.save_paths(node, method, path, keywords)

    def optimizer_constructor(self, node, keywords):
        if "lr" in keywords:
            if "learning_rate" in keywords:
                self.manual(node, "optimizer given both lr= and learning_rate=",
                            "keep learning_rate= only")
            else:
                start = self.source.start(keywords["lr"])
                self.fixed(node, "optimizer(lr=...) -> optimizer(learning_rate=...)",
                           Edit(start, start + len("lr"), "learning_rate"))
        if "decay" in keywords:
            self.manual(node, "Keras 3 optimizers ignore decay= (with a warning)",
                        "pass a schedule: learning_rate=tf.keras.optimizers.schedules."
                        "InverseTimeDecay(lr, decay_steps=1, decay_rate=decay)")

    def set_value(self, node):
        # Three edits around the arguments, so fixes inside them still apply:
        # "K.set_value(" -> "", ", " -> ".assign(", and the ")" stays.
        target, value = node.args
        head = (self.source.start(node), self.source.start(target))
        gap = (self.source.end(target), self.source.start(value))
        if "#" in self.source.text[gap[0]:gap[1]]:
            self.manual(node, "K.set_value fails on Keras 3 variables", "write x.assign(v)")
            return
        wrap = not isinstance(target, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))
        self.fixed(node, "K.set_value(x, v) -> x.assign(v) (Keras 3's set_value fails on "
                   "Keras variables)", Edit(*head, "(" if wrap else ""),
                   Edit(*gap, ").assign(" if wrap else ".assign("))

    def save_paths(self, node, method, path, keywords):
        tail = _string_tail(node.args[0]) if node.args else None
        if tail is None:
            return
        name = method or (path or "").rsplit(".", 1)[-1]
        flag = keywords.get("save_weights_only")
        weights_only = flag is not None and isinstance(flag.value, ast.Constant) \
            and flag.value.value is True
        is_checkpoint = path == "keras.callbacks.ModelCheckpoint"
        saves_model = name == "save" and isinstance(node.func.value, ast.Name) \
            and "model" in node.func.value.id.lower()
        if name == "save_weights" or (is_checkpoint and weights_only):
            if not tail.endswith(".weights.h5"):
                self.manual(node, "Keras 3 saves weights only to a file ending in .weights.h5",
                            "end the path in .weights.h5")
        elif name == "load_model" and tail.endswith(".h5"):
            self.manual(node, "Keras 3 cannot go on training from a whole-model .h5 file: a "
                        "Keras 2 one fails to rebuild its optimizer, a Keras 3 one fails at "
                        "the first step", "save checkpoints as .keras files; to start from an "
                        "old .h5, load it with tf.keras.models.load_model(path, compile=False) "
                        "and compile it with a new hvd.DistributedOptimizer")
        elif (saves_model or is_checkpoint or name == "load_model") \
                and not tail.endswith((".keras", ".h5")):
            self.manual(node, "Keras 3 saves and loads whole models only as .keras (or "
                        "legacy .h5) files, not SavedModel directories",
                        "use a path ending in .keras (model.export(path) writes a "
                        "SavedModel for serving)")

    # -- attributes --------------------------------------------------------------
    def attribute(self, node):
        if node.attr == "lr":
            kind = self.optimizers.kind(node.value)
            if kind == "keras":
                end = self.source.end(node)
                self.fixed(node, "optimizer.lr -> optimizer.learning_rate",
                           Edit(end - len("lr"), end, "learning_rate"))
            elif kind is None and _looks_like_optimizer(node.value):
                self.manual(node, "Keras 3 optimizers have no .lr (not rewritten: this tool "
                            "cannot tell that this is a Keras optimizer)",
                            "use .learning_rate if it is one")
        elif node.attr in ("get_gradients", "_aggregate_gradients"):
            self.manual(node, f"Keras 3 optimizers have no {node.attr}",
                        _OPTIMIZER_INTERNALS[node.attr])
        elif node.attr in ("weights", "get_weights", "get_updates", "minimize") \
                and self.optimizers.kind(node.value) == "keras":
            self.manual(node, f"Keras 3 optimizers have no {node.attr}",
                        "use .variables" if "weights" in node.attr else
                        "compute gradients with tf.GradientTape (hvd.DistributedGradientTape) "
                        "and call apply_gradients")
        parent = self.path(node.value)
        if parent in ("keras.optimizers.legacy", "keras.optimizers.experimental"):
            if node.attr in OPTIMIZERS:
                self.fixed(node, f"optimizers.{parent.rsplit('.', 1)[1]}.{node.attr} -> "
                           f"optimizers.{node.attr} (Keras 3 has no {parent})",
                           Edit(self.source.end(node.value.value), self.source.end(node.value),
                                ""))
            else:
                self.manual(node, f"Keras 3 has no {parent}.{node.attr}",
                            "use the Keras 3 class of keras.optimizers and its API")

    def legacy_import(self, node):
        if isinstance(node, ast.ImportFrom):
            modules = [(node, node.module, [a.name for a in node.names], 1)]
        else:
            modules = [(a, a.name, None, 0) for a in node.names if a.asname]
        for owner, module, names, skip in modules:
            path = keras_path(module) if module else None
            if path not in ("keras.optimizers.legacy", "keras.optimizers.experimental"):
                continue
            if names is not None and not set(names) <= OPTIMIZERS:
                self.manual(node, f"Keras 3 has no {path}",
                            f"import from {module.rsplit('.', 1)[0]} and use Keras 3's API")
                continue
            start, end = dotted_span(self.source, owner, module, skip=skip)
            self.fixed(node, f"{module} -> {module.rsplit('.', 1)[0]}",
                       Edit(start, end, module.rsplit(".", 1)[0]))

    # -- classes ---------------------------------------------------------------
    def class_def(self, node):
        if not any((self.path(base) or "").startswith("keras.optimizers.")
                   for base in node.bases):
            return
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and item.name in _OPTIMIZER_INTERNALS:
                self.manual(item, f"{node.name}.{item.name} overrides a Keras 2 optimizer "
                            "method that Keras 3 never calls", _OPTIMIZER_INTERNALS[item.name])


def fix_keras_idioms(source, aliases):
    """Edits and findings for the Keras 2 idioms in ``source``.

    Args:
        source: a :class:`tfring.migrate.source.Source`.
        aliases: its imports, from :func:`tfring.migrate.source.import_aliases`.

    Returns:
        (edits, findings).
    """
    return _Rules(source, aliases).run()
