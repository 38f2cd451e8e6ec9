"""docs/errors.md names, for each bad input, the test that checks it: those
tests must exist, and every bad-input test must be in the table."""
import os
import re

from support import ROOT

DOC = os.path.join(ROOT, "docs", "errors.md")
_REF = re.compile(r"`((?:common|tensorflow|keras|runner|build)/[\w/]+\.py)::(\w+)(?:\[([\w-]+)\])?`")


def references():
    with open(DOC) as f:
        return _REF.findall(f.read())


def test_every_test_named_in_errors_md_exists():
    refs = references()
    assert len(refs) > 30
    for path, name, param in refs:
        full = os.path.join(ROOT, "tests", path)
        assert os.path.exists(full), f"docs/errors.md names {path}, which does not exist"
        with open(full) as f:
            source = f.read()
        assert re.search(rf"^def {name}\(", source, re.M), f"{path} has no {name}"
        if param:
            assert f'"{param}"' in source, f"{path}::{name} has no parameter {param}"


def test_every_bad_input_test_is_in_errors_md():
    named = {(path, name) for path, name, _ in references()}
    path = "tensorflow/ranks/test_bad_input.py"
    with open(os.path.join(ROOT, "tests", path)) as f:
        tests = re.findall(r"^def (test_\w+)\(", f.read(), re.M)
    missing = [t for t in tests if (path, t) not in named]
    assert not missing, f"docs/errors.md does not mention {missing}"
