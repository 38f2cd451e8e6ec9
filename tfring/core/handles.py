"""What a submitted collective of tfring.core gives back: a :class:`Handle`
to poll or wait on (tfring/core/ops.py makes them). A call that took the
one-call path (ops._submit_array) gets an :class:`_ArrayHandle`, whose
blocking wait is one call into the core."""
from tfring.core import arrays, errors


class Handle:
    """A submitted collective: poll it, or wait for its result.

    Example:
        >>> h = hvd.allreduce_async(x, op=hvd.Sum)
        >>> while not h.poll():
        ...     pass  # other work
        >>> total = h.wait()
    """

    def __init__(self, call, result, inputs=None):
        self._call = call
        self._result = result
        self._value = None
        self._taken = False
        # A GPU call's first input (arrays.Adapted): its waits complete by
        # event on the caller's stream.
        first = inputs[0] if inputs else None
        gpu = first is not None and first.device != arrays.CPU
        self._device_array = first.array if gpu else None
        self._submitted_stream = first.stream if gpu else 0

    def poll(self):
        """True once the collective has finished (successfully or not)."""
        return self._call.done()

    def wait(self, timeout=None):
        """Waits for the collective and returns its result.

        On a GPU this completes by event, as ``torch.distributed``'s
        ``work.wait()`` does: it returns once the collective is queued on
        its device, with the caller's current stream (torch's or CuPy's)
        made to wait for it there. The host does not wait for the device:
        work the caller queues next on that stream reads the result, and
        reading it on the host (``.cpu()``, ``.get()``) waits as any copy
        does. A failure on the device after that (an NCCL or CUDA error, a
        peer lost mid-way) fails the job: the next collective raises it.
        Host arrays are complete when this returns.

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

        Example:
            >>> y = hvd.allreduce_async(x).wait()
        """
        if self._taken:
            return self._value
        if self._device_array is not None:
            stream = arrays.caller_stream(self._device_array, self._submitted_stream)
            status = _in_slices(lambda s: self._call.wait_on_stream(stream, s), timeout)
            errors.raise_for_status(*status)
        else:
            _in_slices(lambda s: self._call.wait(s) or None, timeout)
            errors.raise_for_status(*self._call.status())
        self._value = self._result(self._call)
        self._taken = True
        return self._value


class _ArrayHandle(Handle):
    """The handle of a call submitted by ``_submit_array``: blocking waits
    are one call into the core, which gives back the output array.
    ``device_array``: the GPU array submitted (None for numpy), whose
    caller's stream a wait makes wait for the collective."""

    def __init__(self, call, device_array=None):
        super().__init__(call, _array_result)
        self._device_array = device_array

    def wait(self, timeout=None):
        if self._taken or timeout is not None:
            return super().wait(timeout)
        stream = None if self._device_array is None else arrays.caller_stream(self._device_array)
        result = self._call.wait_result(stream)
        if type(result) is tuple:
            errors.raise_for_status(*result)
        self._value, self._taken = result, True
        return result


def _in_slices(wait, timeout):
    """Calls ``wait(seconds)`` in short slices, so that Ctrl-C reaches the
    waiting thread, until it returns something other than None (returned),
    or until ``timeout`` seconds (None: no limit) have passed."""
    remaining = timeout
    while True:
        got = wait(0.2 if remaining is None else min(0.2, remaining))
        if got is not None:
            return got
        if remaining is not None:
            remaining -= 0.2
            if remaining <= 0:
                raise TimeoutError(f"tfring: the collective did not finish in {timeout} s")


def _array_result(call):
    return call.result()


def synchronize(handle):
    """``handle.wait()``, under Horovod's torch name.

    Example:
        >>> out = hvd.synchronize(hvd.allreduce_async(x))
    """
    return handle.wait()
