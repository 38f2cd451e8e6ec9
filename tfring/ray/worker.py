"""The Ray actor that runs one tfring worker, shared by the fixed-size
:class:`~tfring.ray.RayExecutor` and its elastic mode."""
import os
import socket
import traceback

import ray

from tfring.common.exceptions import ends_job
from tfring.runner import remote


class _Worker:
    """One rank's actor. Its methods run in the actor's own process."""

    def __init__(self, fake_host=None):
        self._fake_host = fake_host
        self._executable = None

    def describe(self):
        """(host, node address, pid, GPU ids) of this actor."""
        own = os.environ.get("TFRING_HOSTNAME", "")
        host = self._fake_host or (own if own and "," not in own else socket.gethostname())
        gpus = [str(g) for g in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
        return host, ray.util.get_node_ip_address(), os.getpid(), gpus

    def setup(self, env, executable_cls=None, args=(), kwargs=None, unset=()):
        """Sets this rank's environment (before any init()), removing the
        names in `unset`, then makes the executable object that
        :meth:`RayExecutor.execute` hands to its fn."""
        for name in unset:
            os.environ.pop(name, None)
        os.environ.update(env)
        if executable_cls is not None:
            self._executable = executable_cls(*args, **(kwargs or {}))
        return True

    def execute(self, fn, args, kwargs, with_executable):
        try:
            if with_executable:
                return "ok", fn(self._executable)
            return "ok", fn(*args, **(kwargs or {}))
        except BaseException as e:  # noqa: BLE001 - handed to the driver, whatever it is
            text = traceback.format_exc()
            try:
                payload = ray.cloudpickle.dumps(e)
            except Exception:  # noqa: BLE001 - an exception that cannot travel
                payload = None
            # Whether it is an echo of a failure elsewhere (a lost peer):
            # judged here, where the exception is, by its cause.
            return "error", (payload, f"{type(e).__name__}: {e}", text, ends_job(e))

    def stop_tfring(self):
        """Shuts tfring down in this process, if it was started here."""
        return stop_tfring()




_RemoteWorker = ray.remote(_Worker)


def start(index, **options):
    """Starts the actor of worker `index` with Ray `options`; under fake
    hosts (``TFRING_HOSTNAME=a,a,b``) it reports the index's name."""
    fake = remote.fake_host_names()
    return _RemoteWorker.options(**options).remote(
        fake[index] if fake and index < len(fake) else None)


def stop_tfring():
    """Shuts tfring down in this Ray worker process, if something in it
    started tfring (a RayExecutor actor's function, a TfringTrainer loop);
    returns True. Errors are ignored: the process is going away anyway."""
    import sys
    basics = sys.modules.get("tfring.common.basics")
    if basics is not None:
        try:
            basics.shutdown()
        except Exception:  # noqa: BLE001 - the worker is going away anyway
            pass
    return True
