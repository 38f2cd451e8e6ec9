"""DistributedOptimizer for tfring.torch: gradients are averaged across
ranks while the backward pass runs.

Each parameter's gradient starts its allreduce from the parameter's
post-accumulate-grad hook, that is as soon as autograd has finished it, so
communication overlaps the rest of the backward pass. ``step()`` waits for
them (``synchronize()``), writes the averages into ``.grad`` and steps.
"""
import contextlib
import warnings

import torch

import tfring.core as _core
from tfring.torch import mpi_ops
from tfring.common.compression import check_compression
from tfring.torch.compression import Compression, predivide
from tfring.torch.mpi_ops import Adasum, Average, Sum, global_process_set


class _DistributedOptimizer:
    """The methods mixed into the user's optimizer class (see
    :func:`DistributedOptimizer`)."""

    def _tfring_setup(self, named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, groups, sparse_as_dense, process_set):
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not (isinstance(n, tuple) and len(n) == 2) for n in named):
                raise ValueError("named_parameters must be (name, parameter) pairs, as "
                                 "model.named_parameters() gives")
            names = {id(p): n for n, p in named}
            if len(set(names.values())) != len(named):
                raise ValueError("named_parameters has duplicate names")
            missing = [p for p in params if id(p) not in names]
            if missing:
                raise ValueError(f"named_parameters lacks {len(missing)} of the optimizer's "
                                 "parameters: give every parameter the optimizer updates")
        else:
            names = {id(p): f"param.{i}" for i, p in enumerate(params)}
        if op not in (Average, Sum, Adasum):
            raise ValueError("DistributedOptimizer: op must be Average, Sum or Adasum")
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        self._names = names
        self._compression = check_compression(compression, "DistributedOptimizer",
                                              stateful_ok=True)
        self._passes = int(backward_passes_per_step)
        self._op = op
        self._prescale = 1.0 / gradient_predivide_factor
        self._postscale = float(gradient_predivide_factor)
        self._stateful = getattr(self._compression, "stateful", False)
        if self._stateful:
            self._compression.check_reduction(op == Average, "DistributedOptimizer")
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._groups = self._make_groups(params, groups)
        self._group_of = {id(p): g for g, members in enumerate(self._groups) for p in members}
        self._pending = {}        # group index -> [(handle, [(param, compression ctx)])]
        self._ready = {}          # group index -> params whose gradient is final
        self._countdown = {id(p): self._passes for p in params}
        self._synchronized = False
        self._skip = False
        # A rank outside the process set reduces nothing: its step() uses its
        # own gradients, and it is never asked into the set's allreduces.
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad)
                       for p in params if p.requires_grad] if self._in_set() else []
        self._step_count = 0

    @staticmethod
    def _make_groups(params, groups):
        """Lists of parameters reduced together: one per parameter (None),
        ``groups`` of about equal length (an int), or the given lists (the
        parameters in none of them alone)."""
        if groups is None:
            return [[p] for p in params]
        if isinstance(groups, int):
            if groups < 1:
                raise ValueError("groups must be a positive int or a list of parameter lists")
            per = -(-len(params) // groups)
            return [params[i:i + per] for i in range(0, len(params), per)]
        listed = {id(p) for g in groups for p in g}
        known = {id(p) for p in params}
        if not listed <= known:
            raise ValueError("groups names parameters the optimizer does not have")
        return [list(g) for g in groups if g] + [[p] for p in params if id(p) not in listed]

    def _group_name(self, g):
        return "tfring.grad." + "+".join(self._names[id(p)] for p in self._groups[g][:2]) + (
            f"+{len(self._groups[g]) - 2}" if len(self._groups[g]) > 2 else "")

    def _on_grad(self, p):
        if self._skip_hooks():
            return
        key = id(p)
        self._countdown[key] -= 1
        if self._countdown[key] > 0:
            return
        if self._countdown[key] < 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before "
                "step() or synchronize(): raise backward_passes_per_step, or call step()")
        if self._stateful:
            return  # reduced all together in synchronize()
        g = self._group_of[key]
        ready = self._ready.setdefault(g, [])
        ready.append(p)
        if len(ready) == len(self._groups[g]):
            self._start(g)

    def _in_set(self):
        ps = self._process_set
        return ps is None or ps is global_process_set or ps.included()

    def _skip_hooks(self):
        return (_core.size() == 1 and self._op != Adasum and
                self._prescale * self._postscale == 1) or not self._in_set()

    def _grad(self, p):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse and self._sparse_as_dense:
            p.grad = p.grad.to_dense()
        return p.grad

    def _start(self, g):
        params = self._groups[g]
        grads = [self._grad(p) for p in params]
        parts = []
        # Sparse gradients, as Horovod reduces them by default: each its own
        # allgather of indices and values (sparse_allreduce_async).
        for p in (p for p, grad in zip(params, grads) if grad.is_sparse):
            if self._op == Adasum:
                raise ValueError("tfring: Adasum reduces dense gradients only: pass "
                                 "sparse_as_dense=True")
            handle = mpi_ops.sparse_allreduce_async(
                p.grad, name=f"{self._group_name(g)}.sparse.{self._names[id(p)]}",
                op=self._op, process_set=self._process_set)
            parts.append((handle, [(p, None)]))
        dense = [p for p, grad in zip(params, grads) if not grad.is_sparse]
        if dense:
            sent, op, prescale = predivide([p.grad for p in dense], self._compression, self._op,
                                           self._prescale, self._process_set)
            compressed = [self._compression.compress(t) for t in sent]
            # In place, as Horovod does: uncompressed, each gradient is reduced
            # in its own .grad (no new tensor, no copy back).
            handle = mpi_ops.grouped_allreduce_async_(
                [c[0] for c in compressed], name=self._group_name(g), op=op,
                prescale_factor=prescale, postscale_factor=self._postscale,
                process_set=self._process_set)
            parts.append((handle, [(p, c[1]) for p, c in zip(dense, compressed)]))
        self._pending[g] = parts
        self._ready.pop(g, None)

    def synchronize(self):
        """Waits for every gradient's allreduce and writes the results into
        ``.grad``; starts those whose hook did not run (a parameter unused in
        this step is reduced as zeros, so that every rank makes the same
        calls).

        Raises:
            HorovodInternalError: an allreduce failed.

        Example:
            >>> loss.backward()
            >>> optimizer.synchronize()
            >>> torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            >>> with optimizer.skip_synchronize():
            ...     optimizer.step()
        """
        if self._stateful and not self._skip_hooks():
            try:
                self._reduce_stateful()
            finally:
                for key in self._countdown:
                    self._countdown[key] = self._passes
            self._synchronized = True
            return
        if not self._skip_hooks():
            for g in range(len(self._groups)):
                if g not in self._pending:
                    self._start(g)
        try:
            for g in sorted(self._pending):
                for handle, params in self._pending[g]:
                    if isinstance(handle, mpi_ops.SparseHandle):
                        params[0][0].grad = handle()
                        continue
                    reduced = mpi_ops.synchronize(handle)
                    with torch.no_grad():
                        for (p, ctx), r in zip(params, reduced):
                            value = self._compression.decompress(r, ctx)
                            if value is not p.grad:
                                p.grad.copy_(value)
        finally:
            self._end_step()
        self._synchronized = True

    def _end_step(self):
        """Forgets the step's reductions (taken, or dropped) and counts
        backward passes afresh."""
        self._pending.clear()
        self._ready.clear()
        for key in self._countdown:
            self._countdown[key] = self._passes

    def _reduce_stateful(self):
        """All gradients through a stateful compressor (PowerSGD), which
        needs every gradient of the step at once: it sends them in two
        requests (the P matrices with the uncompressed gradients, then the
        Q matrices), after backward() rather than overlapped with it."""
        params = [p for group in self._groups for p in group]
        grads = [self._grad(p) for p in params]
        if any(g.is_sparse for g in grads):
            raise ValueError("tfring: Compression.powersgd needs dense gradients: pass "
                             "sparse_as_dense=True")
        ps = self._process_set

        def allreduce_mean(tensors):
            return mpi_ops.synchronize(mpi_ops.grouped_allreduce_async(
                tensors, op=Average, prescale_factor=self._prescale,
                postscale_factor=self._postscale, process_set=ps))
        rank = (ps.rank() if ps is not None and ps is not global_process_set
                else _core.rank())
        reduced = self._compression.reduce(
            [(self._names[id(p)], g) for p, g in zip(params, grads)], allreduce_mean, rank)
        with torch.no_grad():
            for p, r in zip(params, reduced):
                p.grad.copy_(r)

    def state_dict(self):
        """The wrapped optimizer's state_dict(), plus a stateful
        compressor's state (PowerSGD's) under "tfring_compression"."""
        state = super().state_dict()
        if self._stateful:
            state["tfring_compression"] = self._compression.state_dict()
        return state

    def load_state_dict(self, state_dict):
        """Loads a state_dict(); a stateful compressor's part goes to it
        (see tfring.torch.powersgd.PowerSGD.load_state_dict)."""
        # A loaded state starts a new step: reductions the step under way
        # started are waited for (after a failure they end at once, with
        # their error) and dropped, so that none writes a .grad later. An
        # elastic reset restores the optimizer this way after a failure
        # that interrupted backward().
        for parts in self._pending.values():
            for handle, _ in parts:
                try:
                    mpi_ops.synchronize(handle)
                except Exception:  # noqa: BLE001 - the step is dropped, whatever its end
                    pass
        self._end_step()
        self._synchronized = False
        state_dict = dict(state_dict)
        compression = state_dict.pop("tfring_compression", None)
        if compression is not None and self._stateful:
            ps = self._process_set
            rank = (ps.rank() if ps is not None and ps is not global_process_set
                    else _core.rank())
            self._compression.load_state_dict(compression, rank)
        return super().load_state_dict(state_dict)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Within it, step() does not call synchronize() (call it yourself
        first, e.g. to clip the reduced gradients)."""
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def step(self, closure=None):
        """Waits for the gradients' allreduces (unless within
        skip_synchronize()) and takes the wrapped optimizer's step."""
        if self._skip:
            if not self._synchronized:
                warnings.warn("step() in skip_synchronize() without synchronize() first: "
                              "the gradients are this rank's own")
        else:
            if self._synchronized:
                warnings.warn("step() after synchronize() outside skip_synchronize(): the "
                              "gradients are reduced a second time (use skip_synchronize())")
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's zero_grad().

        Raises:
            AssertionError: allreduces are pending (zero_grad() between
                backward() and step()/synchronize()).
        """
        if self._pending:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return super().zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         groups=None, sparse_as_dense=False, process_set=global_process_set):
    """Wraps a torch optimizer so that its step() uses gradients averaged
    (or summed) across the ranks of ``process_set``.

    The result is an instance of a subclass of the optimizer's own class
    (``isinstance(opt, torch.optim.SGD)`` stays true) sharing its
    param_groups and state.

    Args:
        optimizer: a torch.optim.Optimizer.
        named_parameters: ``model.named_parameters()``: names the
            allreduces (default: numbered in parameter order).
        compression: Compression.none, fp16, bf16 or powersgd(...) (see
            tfring.torch.compression; PowerSGD needs op=Average and reduces
            after backward(), not overlapped with it).
        backward_passes_per_step: backward passes whose gradients torch sums
            locally before one allreduce.
        op: Average (default), Sum or Adasum.
        gradient_predivide_factor: divides before the sum and multiplies
            after it (op=Average only).
        groups: None (one allreduce per parameter), an int (that many
            groups), or lists of parameters reduced together.
        sparse_as_dense: reduce sparse gradients as dense tensors (default:
            as sparse ones, an allgather of their indices and values, as
            Horovod does).
        process_set: the ranks that average (default: every rank). On a
            rank outside it, step() uses the rank's own gradients.

    Returns:
        The distributed optimizer.

    Raises:
        ValueError: bad arguments (a parameter missing from
            named_parameters, op not Average/Sum/Adasum, ...); at step(),
            a sparse gradient with op=Adasum.

    Example:
        >>> opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                                named_parameters=model.named_parameters())
        >>> loss.backward(); opt.step()
    """
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    wrapped = cls.__new__(cls)
    # Share the wrapped optimizer's attributes (param_groups, state, defaults
    # and torch's hooks) rather than constructing a second one.
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._tfring_setup(named_parameters, compression, backward_passes_per_step, op,
                          gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
