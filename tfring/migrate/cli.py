"""``python -m tfring.migrate``: walk the paths, print the diff or write, report, exit status."""
import argparse
import os
import sys
import tokenize

from tfring.migrate.migration import migrate_source

# Exit status bits (ORed together; 2 is argparse's usage error).
CHANGES = 1
MANUAL = 4
UNREADABLE = 8

_EPILOG = """\
exit status (bits ORed together):
  0  nothing to change and nothing to report
  1  fixes to make (printed as a diff), or made (with --write)
  4  lines that need a manual fix (listed on stderr as PATH:LINE: manual: ...)
  8  a file could not be read or parsed
  2  bad command line
so 5 means fixes and manual fixes; a CI step that runs this over a tree
fails until the tree is migrated.
"""


def python_files(paths):
    """The .py files under ``paths`` (files as given; directories walked,
    sorted, skipping hidden directories and __pycache__)."""
    for path in paths:
        if not os.path.isdir(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.join(root, name)


def _read(path):
    with open(path, "rb") as f:
        encoding, _ = tokenize.detect_encoding(f.readline)
    with open(path, encoding=encoding, newline="") as f:
        return f.read(), encoding


def migrate_paths(paths, write=False, out=None, err=None):
    """Migrates every Python file under ``paths``; returns the exit status.

    Args:
        paths: files and directories (walked for ``*.py``).
        write: rewrite the files in place instead of printing a diff.
        out: where the diff goes (default: sys.stdout).
        err: where the report goes (default: sys.stderr).

    Returns:
        the exit status: :data:`CHANGES`, :data:`MANUAL` and
        :data:`UNREADABLE` ORed, 0 when nothing is to be done.

    Raises:
        Nothing for a bad file: it is reported on ``err`` and counted in
        :data:`UNREADABLE`, and the other files are still migrated.

    Example:
        >>> migrate_paths(["scripts/"], write=True)  # doctest: +SKIP
        1
    """
    out = out or sys.stdout
    err = err or sys.stderr
    status = 0
    for path in python_files(paths):
        try:
            text, encoding = _read(path)
            migration = migrate_source(text, path)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as e:
            print(f"{path}: cannot migrate: {e}", file=err)
            status |= UNREADABLE
            continue
        for finding in migration.findings:
            print(finding.format(path), file=err)
        if migration.manual:
            status |= MANUAL
        if migration.changed:
            status |= CHANGES
            if write:
                with open(path, "w", encoding=encoding, newline="") as f:
                    f.write(migration.text)
                print(f"{path}: rewritten", file=err)
            else:
                out.write(migration.diff())
    return status


def main(argv=None):
    """``python -m tfring.migrate [--write] PATHS...``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m tfring.migrate",
        description="Move Horovod TensorFlow/Keras scripts to tfring and Keras 3: rewrite "
                    "Horovod's imports, fix the Keras 2 idioms Keras 3 rejects where the "
                    "fix is mechanical, and report the rest with the line and the manual "
                    "fix. Prints a unified diff unless --write is given.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="Python files, or directories to search for *.py")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the files in place instead of printing the diff")
    args = parser.parse_args(argv)
    return migrate_paths(args.paths, write=args.write)
