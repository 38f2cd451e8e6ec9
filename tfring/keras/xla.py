"""Keras 3's XLA compilation for models with a DistributedOptimizer.

Keras 3 compiles models with ``jit_compile="auto"``. ``compile()`` resolves
it once (``fit()`` does not resolve it again): XLA when TensorFlow sees a GPU,
no ``tf.distribute`` strategy is in use and every layer supports XLA;
otherwise no XLA. tfring's collectives have XLA kernels
(tf_ops/tensorflow/xla/), so such a step, and an explicit
``jit_compile=True``, compile with XLA and reduce the gradients inside it.

XLA stays off for a model with a DistributedOptimizer only when tfring may
not use it (:func:`tfring.common.basics.xla_enabled`): ``TFRING_XLA=0``
(alias ``HOROVOD_XLA``), or a build whose TensorFlow lacked XLA's headers.
Then tfring turns XLA off when it came from ``"auto"``, and says so once per
model; an explicit ``jit_compile=True`` is an error instead: the user asked
for something that cannot run. (Reducing the gradients outside the compiled
step was the other way; it would mean replacing Keras's train step, which
users override, so it is not done.)

Which optimizer a model trains with is known only to the model, so tfring
hooks two Keras methods: ``compile()``, to remember what the user asked for
and decide at once, and the TensorFlow trainer's ``make_train_function()``,
which builds the step at the first ``fit()``/``train_on_batch()``: the
optimizer may have been made distributed after ``compile()``.
"""
import functools
import inspect
import logging

from tfring.common import basics
from tfring.keras.distributed import _DistributedMixin

_log = logging.getLogger("tfring")

# Attributes tfring keeps on a Keras 3 model.
_REQUESTED = "_tfring_jit_compile_requested"  # compile()'s jit_compile argument
_NOTIFIED = "_tfring_xla_notice_given"

_installed = False


def uses_distributed_optimizer(model):
    """True if `model`'s optimizer is a tfring DistributedOptimizer, also when
    Keras wrapped it (compile() wraps it in a LossScaleOptimizer under a
    mixed_float16 policy)."""
    optimizer, seen = getattr(model, "optimizer", None), set()
    while optimizer is not None and id(optimizer) not in seen:
        if isinstance(optimizer, _DistributedMixin):
            return True
        seen.add(id(optimizer))
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return False


def _asked_for_auto(requested):
    return isinstance(requested, str) and requested == "auto"


def settle(model):
    """Makes sure `model`'s train step will not be XLA-compiled if its
    optimizer is a tfring DistributedOptimizer and tfring may not use XLA
    (:func:`tfring.common.basics._why_no_xla`).

    Raises:
        ValueError: the model was compiled with an explicit jit_compile=True.
    """
    if getattr(model, "run_eagerly", False) or not uses_distributed_optimizer(model):
        return
    if not model.jit_compile:
        return
    why = basics._why_no_xla()
    if why is None:
        return
    requested = model.__dict__.get(_REQUESTED, "auto")
    if not _asked_for_auto(requested):
        raise ValueError(
            f"Model '{model.name}' was compiled with jit_compile={requested!r}, but its "
            f"optimizer is a tfring DistributedOptimizer and {why}. Compile with "
            "jit_compile=False, or leave jit_compile at its default \"auto\" (tfring then "
            "turns XLA off for this model).")
    model.jit_compile = False
    if not model.__dict__.get(_NOTIFIED):
        object.__setattr__(model, _NOTIFIED, True)
        _log.warning(
            "tfring: model '%s' will run without XLA: Keras's jit_compile=\"auto\" chose XLA "
            "on this machine, but the model's optimizer is a tfring DistributedOptimizer and "
            "%s. Compile with jit_compile=False to silence this notice.", model.name, why)


def settle_loaded(model):
    """For a Keras 3 model that hvd.load_model just gave a DistributedOptimizer:
    its compile() ran from the saved config, whose jit_compile is what Keras
    resolved "auto" to when it was saved, not a request of this user."""
    if hasattr(type(model), "_resolve_auto_jit_compile"):
        object.__setattr__(model, _REQUESTED, "auto")
        settle(model)


def _wrap_compile(compile_fn):
    signature = inspect.signature(compile_fn)

    @functools.wraps(compile_fn)
    def compile(self, *args, **kwargs):  # pylint: disable=redefined-builtin
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return compile_fn(self, *args, **kwargs)  # Keras names the bad argument
        bound.apply_defaults()
        result = compile_fn(self, *args, **kwargs)
        object.__setattr__(self, _REQUESTED, bound.arguments.get("jit_compile", "auto"))
        settle(self)
        return result

    return compile


def _wrap_make_train_function(make_fn):
    @functools.wraps(make_fn)
    def make_train_function(self, force=False):
        if force or self.train_function is None:
            settle(self)
        return make_fn(self, force)

    return make_train_function


def install():
    """Hooks Keras 3's Trainer (once per process). Does nothing if Keras 3's
    trainer is not where it is expected; where tfring may not use XLA, the
    first XLA-compiled step then fails with an error saying to compile with
    jit_compile=False."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
        from keras.src.trainers.trainer import Trainer
    except ImportError:
        return
    Trainer.compile = _wrap_compile(Trainer.compile)
    TensorFlowTrainer.make_train_function = _wrap_make_train_function(
        TensorFlowTrainer.make_train_function)
