"""Test files outside the rank suites have names unique across tests/: the
folders are not packages, so pytest imports each file by its base name, and
two of a name stop a whole-tree run at collection."""
import collections
import os

from support import ROOT


def test_test_file_names_are_unique():
    seen = collections.defaultdict(list)
    for folder, dirs, files in os.walk(os.path.join(ROOT, "tests")):
        # Rank suites run in their own pytest, one folder at a time.
        dirs[:] = [d for d in dirs if d not in ("ranks", "__pycache__")]
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                seen[name].append(os.path.relpath(os.path.join(folder, name), ROOT))
    assert not {n: p for n, p in seen.items() if len(p) > 1}
