"""How tfring.tensorflow calls its ops: the op library, an op by its kind in
eager mode and in graphs, names, the checks every collective makes of its
inputs, and the typed errors of a failed eager op. mpi_ops.py builds
Horovod's API on these.
"""
import contextlib
import re

import tensorflow as tf

from tfring.common import loader, tf_errors
from tfring.common.process_sets import registered_id

SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
                    tf.bfloat16, tf.float32, tf.float64, tf.bool)
# The same as enum values: a set lookup per call instead of comparing DType
# objects one by one (eight DType.__eq__ calls cost ~5 us of an eager call).
_SUPPORTED_ENUMS = frozenset(d.as_datatype_enum for d in SUPPORTED_DTYPES)


def ops():
    return loader.load()[0]


def let_collectives_run_concurrently():
    """Lets tf.function run our collectives in any order, all at once.

    The ops are stateful (so Grappler never merges or folds them), and
    tf.function chains stateful ops without resource inputs in program order.
    That would make every allreduce wait for the previous one to finish: a
    negotiation round trip per tensor and no fusion. The coordinator already
    gives every rank one order, so TF may run them concurrently: they go on
    TF's list of stateful ops that must run but need no order. Barrier, join
    and the in-place broadcast keep their order.
    """
    try:
        from tensorflow.python.framework import auto_control_deps as acd
        acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = (
            acd.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS | frozenset({
                "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
                "HorovodGroupedAllgather", "HorovodBroadcast", "HorovodAlltoall",
                "HorovodReducescatter", "HorovodGroupedReducescatter"}))
    except (ImportError, AttributeError, TypeError) as exc:  # a TF without this hook
        import warnings
        warnings.warn(f"tfring: collectives inside tf.function will run one at a time ({exc})")


let_collectives_run_concurrently()


def normalize_name(name):
    """Turns a tensor name into a valid op name."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def default_name(prefix, tensor, name):
    if name is None and not tf.executing_eagerly():
        return f"{prefix}_{normalize_name(tensor.name)}"
    return name


def collective(kind, *inputs, name=None, graph_name=None, **attrs):
    """Runs the collective `kind` ("Allreduce", "GroupedAllgather", ...).

    In graphs (tf.function, TF1) this is Horovod's op Horovod<kind>, keyed by
    its node name `graph_name`, so graphs stay loadable by and from Horovod.
    Eager execution drops op names, and TF's eager runtime keeps one kernel
    per distinct set of attribute values for the life of the process: a key
    passed as an attribute would cost a kernel (~35 KB) per distinct name. So
    eager mode runs the twin TfringNamed<kind>, which takes the key as a
    string input: `name`, else the Horovod op's name, as before.
    """
    snake = _SNAKE.get(kind)
    if snake is None:
        snake = _SNAKE[kind] = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
    if tf.executing_eagerly():
        key = name if name is not None else f"Horovod{kind}"
        with typed_errors():
            return getattr(ops(), f"tfring_named_{snake}")(*inputs, _eager_key(key), **attrs)
    return getattr(ops(), f"horovod_{snake}")(*inputs, name=graph_name, **attrs)


_SNAKE = {}  # "GroupedAllreduce" -> "grouped_allreduce"
_EAGER_KEYS = {}
_EAGER_KEYS_MAX = 4096


def _eager_key(key):
    """The eager op's key input for a collective's name, made once per name:
    a string tensor made per call was a quarter of an eager 4 KB allreduce's
    cost. A script that makes names without end (a counter in each) only
    refills the table, which is emptied when full."""
    tensor = _EAGER_KEYS.get(key)
    if tensor is None:
        if len(_EAGER_KEYS) >= _EAGER_KEYS_MAX:
            _EAGER_KEYS.clear()
        tensor = _EAGER_KEYS[key] = tf.constant(key)
    return tensor


@contextlib.contextmanager
def typed_errors():
    """Raises a failed eager op's error as tfring's type of it, with
    ``.cause`` and ``.rank`` (tfring.common.tf_errors). In graphs TensorFlow
    raises the error where the graph runs: tf_errors.failure_of reads the
    same from it there."""
    try:
        yield
    except tf.errors.OpError as e:
        raise tf_errors.typed(e) from None


def as_tensor(value):
    """`value` as a tensor; a tensor as it is, without the conversion
    registry's walk (~2 us an eager call, paid twice per allreduce)."""
    return value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)


def check_dtype(tensor, what):
    # tf.as_dtype: a Keras 3 variable's dtype is a string such as "float32".
    dtype = tensor.dtype
    if not isinstance(dtype, tf.DType):
        dtype = tf.as_dtype(dtype)
    if dtype.base_dtype.as_datatype_enum not in _SUPPORTED_ENUMS:
        dtype = dtype.base_dtype
        supported = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise tf.errors.InvalidArgumentError(
            None, None,
            f"tfring {what} does not support dtype {dtype.name}; supported: {supported}.")


def set_id(process_set):
    return registered_id(process_set)


def per_dtype(tensors, what, name, prefix, run):
    """Runs a grouped op once per dtype (the ops take one dtype) and returns
    the outputs in input order. `run(tensors, group_name)` makes one op."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    by_dtype = {}
    for i, t in enumerate(tensors):
        check_dtype(t, what)
        by_dtype.setdefault(t.dtype, []).append(i)
    results = [None] * len(tensors)
    for dtype, idx in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
        group_name = name if name is None or len(by_dtype) == 1 else f"{name}_{dtype.name}"
        if group_name is None and not tf.executing_eagerly():
            group_name = f"{prefix}_{normalize_name(tensors[idx[0]].name)}"
        for i, out in zip(idx, run([tensors[i] for i in idx], group_name)):
            results[i] = out
    return results
