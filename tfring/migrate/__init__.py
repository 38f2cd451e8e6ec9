"""Moving Horovod TensorFlow/Keras scripts to tfring and Keras 3.

From the shell: ``python -m tfring.migrate [--write] PATHS...`` (see
``--help`` and docs/migration.md, "Keras 3 pitfalls"). It rewrites Horovod's
imports to tfring's, fixes the Keras 2 idioms that Keras 3 rejects where the
fix is mechanical, and reports the rest with the line and what to do. Only
Python's ``ast`` and ``tokenize`` are used: TensorFlow need not be installed,
and strings, comments and formatting are never touched.

The modules: :mod:`~tfring.migrate.imports` (Horovod imports),
:mod:`~tfring.migrate.keras_idioms` (Keras 2 -> 3),
:mod:`~tfring.migrate.source` (spans, edits, findings),
:mod:`~tfring.migrate.migration` (one file) and :mod:`~tfring.migrate.cli`.
"""
from tfring.migrate.cli import migrate_paths
from tfring.migrate.migration import Migration, migrate_source

__all__ = ["migrate", "migrate_paths", "migrate_source", "Migration"]


def migrate(paths, write=False):
    """Migrates the Python files under ``paths``, as ``python -m tfring.migrate`` does.

    Prints a unified diff of the fixes to stdout (or, with ``write``,
    rewrites the files in place) and the report to stderr: one
    ``PATH:LINE: fixed: ...`` line per fix and one ``PATH:LINE: manual:
    ... Fix: ...`` line per thing a person has to change.

    Args:
        paths: a list of files and directories (walked for ``*.py``).
        write: rewrite the files instead of printing the diff.

    Returns:
        int: the exit status: 0 when there is nothing to do, else the bits
        1 (fixes to make or made), 4 (manual fixes needed) and 8 (a file
        could not be read or parsed) ORed together.

    Raises:
        TypeError: ``paths`` is a single string rather than a list.

    Example:
        >>> import tfring.migrate
        >>> status = tfring.migrate.migrate(["train.py"])  # doctest: +SKIP
        >>> status & tfring.migrate.cli.MANUAL             # doctest: +SKIP
        0
    """
    if isinstance(paths, (str, bytes)):
        raise TypeError("paths must be a list of files and directories, not one string")
    return migrate_paths(paths, write=write)
