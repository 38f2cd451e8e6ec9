"""What a submitted collective of tfring.core gives back: a :class:`Handle`
to poll or wait on (tfring/core/ops.py makes them). A call that took the
one-call path (ops._submit_array) gets an :class:`_ArrayHandle`, whose
blocking wait is one call into the core."""
from tfring.core import errors


class Handle:
    """A submitted collective: poll it, or wait for its result.

    Example:
        >>> h = hvd.allreduce_async(x, op=hvd.Sum)
        >>> while not h.poll():
        ...     pass  # other work
        >>> total = h.wait()
    """

    def __init__(self, call, result):
        self._call = call
        self._result = result
        self._value = None
        self._taken = False

    def poll(self):
        """True once the collective has finished (successfully or not)."""
        return self._call.done()

    def wait(self, timeout=None):
        """Waits for the collective and returns its result.

        Args:
            timeout: seconds to wait at most (None: until it finishes; a
                collective whose peers never come is ended by the core's
                stall and peer checks, not by this).

        Returns:
            What the blocking function of the same name returns.

        Raises:
            TimeoutError: ``timeout`` passed first (the collective goes on).
            tfring.core.CoreError: the collective failed (see
                tfring.core.errors for the subclasses).
        """
        # Short slices, so that Ctrl-C reaches the waiting thread.
        remaining = timeout
        while not self._call.wait(0.2 if remaining is None else min(0.2, remaining)):
            if remaining is not None:
                remaining -= 0.2
                if remaining <= 0:
                    raise TimeoutError(f"tfring: the collective did not finish in {timeout} s")
        if not self._taken:
            errors.raise_for_status(*self._call.status())
            self._value = self._result(self._call)
            self._taken = True
        return self._value


class _ArrayHandle(Handle):
    """The handle of a call submitted by ``_submit_array``: blocking waits
    are one call into the core, which gives back the output array."""

    def __init__(self, call):
        super().__init__(call, _array_result)

    def wait(self, timeout=None):
        if self._taken or timeout is not None:
            return super().wait(timeout)
        result = self._call.wait_result()
        if type(result) is tuple:
            errors.raise_for_status(*result)
        self._value, self._taken = result, True
        return result


def _array_result(call):
    return call.result()


def synchronize(handle):
    """``handle.wait()``, under Horovod's torch name.

    Example:
        >>> out = hvd.synchronize(hvd.allreduce_async(x))
    """
    return handle.wait()
