"""Where an estimator keeps its data and runs: Horovod's ``Store`` over fsspec.

A store is a directory (a local path or any fsspec URL) laid out as
Horovod's was::

    <prefix>/intermediate_train_data.<idx>/   the DataFrame as Parquet (fit)
    <prefix>/intermediate_val_data.<idx>/
    <prefix>/runs/<run_id>/checkpoint.keras   the model after the last epoch
    <prefix>/runs/<run_id>/checkpoint.json    which epoch that was, and the history
    <prefix>/runs/<run_id>/logs/              TensorBoard's event files

Spark writes the Parquet (so the prefix must be a path Spark can write
too: a local path, ``file://``, ``hdfs://``...); the ranks read it and the
runs through fsspec. Nothing here imports pyspark or TensorFlow.
"""
import os
import posixpath
import uuid


class Store:
    """A store over one fsspec filesystem (Horovod's ``Store``).

    Args:
        prefix_path: the store's root: a local path or an fsspec URL.
        train_path, val_path: where the intermediate Parquet goes (default
            under the prefix).
        runs_path: where runs go (default ``<prefix>/runs``).
        save_runs: keep checkpoints and logs (Horovod's flag).
        storage_options: handed to fsspec (credentials, endpoints).

    Raises:
        ValueError: an empty prefix, or a URL scheme fsspec does not know.

    Example:
        >>> store = Store.create("/tmp/tfring-store")
        >>> store.get_checkpoint_path("run1")
        '/tmp/tfring-store/runs/run1/checkpoint.keras'
    """

    CHECKPOINT_FILENAME = "checkpoint.keras"
    STATE_FILENAME = "checkpoint.json"
    LOGS_SUBDIR = "logs"

    def __init__(self, prefix_path, train_path=None, val_path=None, runs_path=None,
                 save_runs=True, storage_options=None):
        import fsspec
        if not prefix_path:
            raise ValueError("a Store needs a prefix_path (a directory or an fsspec URL)")
        self.storage_options = dict(storage_options or {})
        try:
            self.fs, root = fsspec.core.url_to_fs(str(prefix_path), **self.storage_options)
        except (ValueError, ImportError) as e:
            raise ValueError(f"the store path {prefix_path!r} cannot be opened: {e}") from e
        self.prefix_path = str(prefix_path).rstrip("/")
        self._root = root.rstrip("/") or "/"
        self._train_path = train_path
        self._val_path = val_path
        self._runs_path = runs_path or self._join(self.prefix_path, "runs")
        self._save_runs = save_runs

    @staticmethod
    def create(prefix_path, *args, **kwargs):
        """The store for `prefix_path`: a :class:`LocalStore` for a local
        path or ``file://`` URL, else a :class:`FilesystemStore` (any fsspec
        URL). Arguments as :class:`Store`."""
        text = str(prefix_path)
        if "://" not in text or text.startswith("file://"):
            return LocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    # -- Horovod's layout ---------------------------------------------------
    @staticmethod
    def _join(base, *parts):
        return posixpath.join(base, *parts)

    def get_train_data_path(self, idx=None):
        base = self._train_path or self._join(self.prefix_path, "intermediate_train_data")
        return f"{base}.{idx}" if idx is not None else base

    def get_val_data_path(self, idx=None):
        base = self._val_path or self._join(self.prefix_path, "intermediate_val_data")
        return f"{base}.{idx}" if idx is not None else base

    def get_test_data_path(self, idx=None):
        base = self._join(self.prefix_path, "intermediate_test_data")
        return f"{base}.{idx}" if idx is not None else base

    def saving_runs(self):
        return self._save_runs

    def get_runs_path(self):
        return self._runs_path

    def get_run_path(self, run_id):
        return self._join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id):
        return self._join(self.get_run_path(run_id), self.CHECKPOINT_FILENAME)

    def get_checkpoint_state_path(self, run_id):
        return self._join(self.get_run_path(run_id), self.STATE_FILENAME)

    def get_logs_path(self, run_id):
        return self._join(self.get_run_path(run_id), self.LOGS_SUBDIR)

    def get_checkpoint_filename(self):
        return self.CHECKPOINT_FILENAME

    def get_logs_subdir(self):
        return self.LOGS_SUBDIR

    # -- files --------------------------------------------------------------
    def exists(self, path):
        return self.fs.exists(path)

    def read(self, path):
        with self.fs.open(path, "rb") as f:
            return f.read()

    def write(self, path, data):
        """Writes `data` (bytes) to `path`, whole or not at all (a temporary
        name first, then a move)."""
        parent = posixpath.dirname(path)
        if parent:
            self.fs.makedirs(parent, exist_ok=True)
        temporary = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open(temporary, "wb") as f:
            f.write(data)
        self.fs.mv(temporary, path)

    def remove(self, path):
        """Removes `path` (a file or a directory), if it exists."""
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def upload(self, local_dir, path):
        """Copies the local directory `local_dir` into `path` (TensorBoard's logs)."""
        self.fs.makedirs(path, exist_ok=True)
        for base, _, files in os.walk(local_dir):
            for name in files:
                source = os.path.join(base, name)
                target = self._join(path, os.path.relpath(source, local_dir).replace(os.sep, "/"))
                self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
                self.fs.put_file(source, target)

    def download(self, path, local_dir):
        """Copies the directory `path` (if it exists) into `local_dir`: a hot
        start's logs, which its epochs append to."""
        if not self.fs.exists(path):
            return
        root = self.fs._strip_protocol(path).rstrip("/")
        for name in self.fs.find(path):
            target = os.path.join(local_dir, self.fs._strip_protocol(name)[len(root) + 1:])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            self.fs.get_file(name, target)

    def check_writable(self):
        """Raises OSError naming the prefix when this process cannot create
        and remove a file under it (an unreachable or read-only store)."""
        probe = self._join(self.prefix_path, f".tfring-probe-{uuid.uuid4().hex[:8]}")
        try:
            self.fs.makedirs(self.prefix_path, exist_ok=True)
            with self.fs.open(probe, "wb") as f:
                f.write(b"ok")
            self.fs.rm(probe)
        except Exception as e:  # noqa: BLE001 - every filesystem has its own errors
            raise OSError(f"the store at {self.prefix_path!r} cannot be written: "
                          f"{type(e).__name__}: {e}") from e

    def is_parquet_dataset(self, path):
        """True when `path` holds Parquet files (a Spark output directory or one file)."""
        try:
            return bool(self.parquet_files(path))
        except (OSError, FileNotFoundError):
            return False

    def parquet_files(self, path):
        """The Parquet files of the data set at `path`, in name order (the
        order of Spark's part files)."""
        if self.fs.isfile(path):
            return [path]
        return sorted(p for p in self.fs.find(path)
                      if p.endswith(".parquet") and not posixpath.basename(p).startswith(("_", ".")))

    def get_parquet_dataset(self, path):
        """A ``pyarrow.dataset.Dataset`` over the Parquet at `path`."""
        import pyarrow.dataset as ds
        return ds.dataset(self.parquet_files(path), filesystem=self.fs, format="parquet")


class FilesystemStore(Store):
    """A store on any fsspec filesystem (``s3://``, ``gs://``, ``hdfs://``,
    ``memory://`` ...), as Horovod's ``FilesystemStore``."""


class LocalStore(Store):
    """A store in a local directory (or one every host mounts at the same
    path), as Horovod's ``LocalStore``."""

    def __init__(self, prefix_path, *args, **kwargs):
        text = str(prefix_path)
        if text.startswith("file://"):
            text = text[len("file://"):]
        super().__init__(os.path.abspath(text), *args, **kwargs)
