"""PowerSGD for tfring.tensorflow and tfring.keras: the algorithm is
tfring.common.powersgd's; here its state lives in TensorFlow variables, so
it runs eagerly, in a tf.function and in a TF1 graph.

State, per compressed gradient (by its position in the list of variables
the optimizer or tape reduces), in float32: the m x r matrix Q (the same on every rank)
and the n x m error feedback (this rank's own); and the step. With a
tfring.keras DistributedOptimizer (Keras 3 or tf_keras) they are optimizer
variables (created when the optimizer is built), so ``model.save``,
``tf.train.Checkpoint`` and tfring's TensorFlowKerasState save and restore
them. Elsewhere the
compressor is a ``tf.Module``: checkpoint it yourself, e.g.
``tf.train.Checkpoint(model=model, powersgd=compression)``.
"""
import tensorflow as tf

from tfring.common.powersgd import PowerSGDSettings, powersgd_round


class _TFOps:
    @staticmethod
    def mm(a, b, transpose_a=False, transpose_b=False):
        return tf.linalg.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)

    @staticmethod
    def orthonormal(p):
        return tf.linalg.qr(p).q


def _tf_variable(name, shape, dtype, initializer):
    with tf.init_scope():
        return tf.Variable(initializer(shape, dtype), trainable=False, name=name)


class PowerSGD(PowerSGDSettings, tf.Module):
    """A stateful PowerSGD compressor: give it to one DistributedOptimizer or
    DistributedGradientTape (their gradients in the same order each step).

    Example:
        >>> opt = hvd.DistributedOptimizer(
        ...     keras.optimizers.SGD(0.1),
        ...     compression=hvd.Compression.powersgd(rank=2, start_step=100))
    """

    def __init__(self, **settings):
        PowerSGDSettings.__init__(self, **settings)
        tf.Module.__init__(self, name="powersgd")
        self.step = None
        self.qs = None      # per position: Q variable or None (uncompressed)
        self.errors = None  # per position: error-feedback variable or None

    def build(self, shapes, add_variable=None):
        """Creates the state for gradients of these shapes, in order (once).

        Args:
            shapes: the gradients' shapes (None for a position without one).
            add_variable: ``add_variable(name, shape, dtype, initializer)``
                returning a variable (Keras passes its optimizer's); default
                a plain tf.Variable.
        """
        if self.step is not None:
            return
        add = add_variable or _tf_variable
        qs, errors = [], []
        for i, shape in enumerate(shapes):
            plan = None if shape is None else self.matrix_shape(shape)
            if plan is None:
                qs.append(None)
                errors.append(None)
                continue
            n, m, r = plan
            seed = [self.seed, i]
            qs.append(add(f"powersgd_q_{i}", (m, r), "float32",
                          lambda shape, dtype=None, seed=seed: tf.random.stateless_normal(
                              shape, seed, dtype=dtype)))
            errors.append(add(f"powersgd_error_{i}", (n, m), "float32",
                              lambda shape, dtype=None: tf.zeros(shape, dtype)))
        self.qs, self.errors = qs, errors
        self.step = add("powersgd_step", (), "int64",
                        lambda shape, dtype=None: tf.zeros(shape, dtype))

    def reduce(self, grads, indices, allreduce_mean):
        """Averages grads[i] for i in `indices` across ranks, compressed
        from start_step on.

        Args:
            grads: every gradient of the step, by position (None allowed).
            indices: the positions to reduce (dense, floating, not local).
            allreduce_mean: averages a list of tensors as one request.

        Returns:
            The averaged gradients of `indices`, in order.

        Raises:
            ValueError: a gradient's shape differs from the state's.
        """
        if self.step is None:
            self.build([None if g is None else g.shape for g in grads])
        compressed = [i for i in indices if self.qs[i] is not None and grads[i].dtype.is_floating]
        plain = [i for i in indices if i not in compressed]
        for i in compressed:
            n, m = self.errors[i].shape
            if grads[i].shape.num_elements() != n * m:
                raise ValueError(f"Compression.powersgd: gradient {i} has shape "
                                 f"{grads[i].shape}, not the one its state was built for")
        step = self.step.assign_add(1)

        def uncompressed():
            return allreduce_mean([grads[i] for i in indices])

        def with_powersgd():
            matrices, qs = [], []
            for i in compressed:
                g = grads[i]
                mat = tf.reshape(tf.cast(g, tf.float32), self.errors[i].shape) + self.errors[i]
                matrices.append(mat)
                q = self.qs[i]
                if not self.warm_start:
                    q = tf.random.stateless_normal(q.shape, tf.stack(
                        [tf.constant(self.seed, tf.int64) * 1009 + i, step]))
                qs.append(q)
            approx, new_qs, reduced_plain = powersgd_round(
                matrices, qs, [grads[i] for i in plain], allreduce_mean, _TFOps)
            updates = []
            for i, mat, a, q in zip(compressed, matrices, approx, new_qs):
                updates += [self.qs[i].assign(q), self.errors[i].assign(mat - a)]
            out = dict(zip(plain, reduced_plain))
            out.update((i, tf.cast(tf.reshape(a, grads[i].shape), grads[i].dtype))
                       for i, a in zip(compressed, approx))
            with tf.control_dependencies(updates):
                return [tf.identity(out[i]) for i in indices]

        if tf.executing_eagerly():
            return with_powersgd() if int(step) > self.start_step else uncompressed()
        return tf.cond(step > self.start_step, with_powersgd, uncompressed)

    def forget_errors(self):
        """Zeroes this rank's error feedback: after another rank's state
        was broadcast here (an elastic sync), its residual is not ours, and
        added on every rank it would be counted several times."""
        for e in self.errors or ():
            if e is not None:
                e.assign(tf.zeros_like(e))
