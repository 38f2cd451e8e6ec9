"""docs/migration.md's status tables say what tfring has of Horovod's API:
these tests hold them to the code.

The section "Every Horovod TF/Keras name and its status" holds one table per
module, under a heading "### `horovod.X` → `tfring.Y`". Each row is

    | `name`, `name(signature)`, `dotted.name` | Status, then notes |

and is parsed strictly (a row that does not parse fails the test, never
skipped):

- the first cell is a comma-separated list of backticked names, each
  optionally with a signature: parameters `p` (no default), `p=default` (the
  default evaluated in the module), `p=...` (any default), and a last `...`
  for further parameters (without it the list is the whole signature);
- the status starts with "Same", "Present" or "tfring addition": the names
  must exist in tfring.Y;
- every "`call` raises `Error`" in the notes, optionally after "under
  `VAR=value`," and "after `setup`,", is run in a fresh interpreter and must
  raise that error (or a subclass). An error name or the word "raise(s)"
  anywhere else in a status is an unchecked claim, and fails.

The names and claims are checked by running this file as a script (one
interpreter per environment), so the test process never loads the op
library or initializes tfring.
"""
import json
import os
import re
import subprocess
import sys

import pytest

DOC = os.path.join("docs", "migration.md")
SECTION = "## Every Horovod TF/Keras name and its status"
HEADING = re.compile(r"^### `(horovod(?:\.\w+)*)` → `(tfring(?:\.\w+)*)`$")
TABLE_HEADER = ["| Name | Status |", "|---|---|"]
ROW = re.compile(r"^\| (?P<names>[^|]+) \| (?P<status>[^|]+) \|$")
ITEM = r"`(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\((?P<params>[^`]*)\))?`"
_ANY_ITEM = re.sub(r"\?P<\w+>", "", ITEM)
NAMES = re.compile(rf"{_ANY_ITEM}(?:, {_ANY_ITEM})*")
STATUSES = ("Same", "Present", "tfring addition")
CLAIM = re.compile(r"(?:under `(?P<env>[A-Z_][A-Z0-9_]*=[^`]*)`, )?"
                   r"(?:after `(?P<setup>[^`]+)`, )?"
                   r"`(?P<call>[^`]+)` raises `(?P<error>[A-Za-z_][\w.]*)`")
UNCHECKED = re.compile(r"\braises?\b|`[\w.]*(?:Error|Exception)`")
PROBE_TIMEOUT = 300


class DocFormatError(AssertionError):
    """The status section does not follow the format above."""


def split_params(text):
    """'a, b=(1, 2), ...' -> ['a', 'b=(1, 2)', '...'] (commas inside
    brackets or quotes do not split)."""
    params, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            params.append(text[start:i].strip())
            start = i + 1
    last = text[start:].strip()
    if last:
        params.append(last)
    return params


def parse_params(text, where):
    """A signature's text -> (list of (name, default text or None), open)."""
    if text is None:
        return None
    items = split_params(text)
    more = bool(items) and items[-1] == "..."
    if more:
        items = items[:-1]
    params = []
    for item in items:
        m = re.fullmatch(r"([A-Za-z_]\w*)(?:=(.+))?", item)
        if not m:
            raise DocFormatError(f"{where}: cannot read parameter {item!r}")
        params.append((m.group(1), m.group(2)))
    return {"params": params, "more": more}


def parse_row(line, where):
    m = ROW.match(line)
    if not m:
        raise DocFormatError(f"{where}: not a two-column row: {line!r}")
    names_cell, status = m.group("names"), m.group("status")
    if not NAMES.fullmatch(names_cell):
        raise DocFormatError(f"{where}: the name cell must be backticked names (with "
                             f"optional signatures) separated by ', ': {names_cell!r}")
    names = [{"name": n.group("name"), "signature": parse_params(n.group("params"), where)}
             for n in re.finditer(ITEM, names_cell)]
    if not re.match(rf"(?:{'|'.join(STATUSES)})(?:$|[ ;:,(])", status):
        raise DocFormatError(f"{where}: the status must start with one of {STATUSES}: "
                             f"{status!r}")
    claims = [dict(c.groupdict()) for c in CLAIM.finditer(status)]
    rest = CLAIM.sub("", status)
    unchecked = UNCHECKED.search(rest)
    if unchecked:
        raise DocFormatError(f"{where}: {unchecked.group(0)!r} outside a checkable "
                             f"\"`call` raises `Error`\" claim: {status!r}")
    return {"where": where, "names": names, "claims": claims}


def parse_status_tables(text):
    """([{"horovod", "module", "rows"}], [row errors]) from the status section
    of the page: every row that does not parse is one error (all are
    reported at once); a malformed section, heading or table raises."""
    lines = text.splitlines()
    if lines.count(SECTION) != 1:
        raise DocFormatError(f"{DOC} needs exactly one {SECTION!r} section")
    start = lines.index(SECTION) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    tables, errors, i = [], [], start
    while i < end:
        line = lines[i]
        if not line.startswith("### "):
            if line.startswith("|"):
                raise DocFormatError(f"{DOC}:{i + 1}: a table outside a '### ' module heading")
            i += 1
            continue
        m = HEADING.match(line)
        if not m:
            raise DocFormatError(f"{DOC}:{i + 1}: heading not of the form "
                                 f"### `horovod.X` → `tfring.Y`: {line!r}")
        i += 1
        while i < end and not lines[i].strip():
            i += 1
        if lines[i:i + 2] != TABLE_HEADER:
            raise DocFormatError(f"{DOC}:{i + 1}: expected the table header {TABLE_HEADER}")
        i += 2
        rows = []
        while i < end and lines[i].strip():
            try:
                rows.append(parse_row(lines[i], f"{DOC}:{i + 1}"))
            except DocFormatError as e:
                errors.append(str(e))
            i += 1
        while i < end and not lines[i].strip():
            i += 1
        if i < end and not lines[i].startswith("### "):
            raise DocFormatError(f"{DOC}:{i + 1}: text after the table of {m.group(2)}; "
                                 f"notes belong in the Status column")
        if not rows and not errors:
            raise DocFormatError(f"{DOC}: the table of {m.group(2)} has no rows")
        tables.append({"horovod": m.group(1), "module": m.group(2), "rows": rows})
    if not tables:
        raise DocFormatError(f"{DOC}: no module tables under {SECTION!r}")
    return tables, errors


# --------------------------------------------------------------------------
# The probe: runs in a fresh interpreter (python this_file < JSON).
# --------------------------------------------------------------------------

def _resolve(module, dotted):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _signature_problems(obj, signature, namespace):
    import inspect
    try:
        actual = inspect.signature(obj).parameters
    except (TypeError, ValueError) as e:
        return [f"has no signature to compare ({e})"]
    names = list(actual)
    documented = [name for name, _ in signature["params"]]
    problems = []
    missing = [n for n in documented if n not in actual]
    if missing:
        return [f"has no parameter(s) {missing}; it takes {names}"]
    if [n for n in names if n in documented] != documented:
        problems.append(f"takes {documented} in the order {names}")
    elif not signature["more"] and names != documented:
        problems.append(f"takes {names}, not just {documented} (add '...' for more)")
    for name, default in signature["params"]:
        has_default = actual[name].default is not inspect.Parameter.empty
        if default is None:
            if has_default:
                problems.append(f"{name} has a default ({actual[name].default!r})")
        elif not has_default:
            problems.append(f"{name} has no default")
        elif default != "...":
            want = eval(default, namespace)  # pylint: disable=eval-used
            got = actual[name].default
            if not (got is want or got == want):
                problems.append(f"{name} defaults to {got!r}, not {default}")
    return problems


def probe(request):
    """Checks names (when asked) and claims in this interpreter; returns a
    list of problems."""
    import builtins
    import importlib

    import numpy as np
    import tensorflow as tf
    problems = []
    for table in request["tables"]:
        module = importlib.import_module(table["module"])
        namespace = dict(vars(module), tf=tf, np=np)
        for row in table["rows"]:
            for item in row["names"] if request["names"] else []:
                try:
                    obj = _resolve(module, item["name"])
                except AttributeError as e:
                    problems.append(f"{row['where']}: {table['module']}.{item['name']} "
                                    f"does not exist ({e})")
                    continue
                if item["signature"] is not None:
                    problems += [f"{row['where']}: {table['module']}.{item['name']} {p}"
                                 for p in _signature_problems(obj, item["signature"],
                                                              namespace)]
            for claim in row["claims"]:
                if claim["env"] != request["env"]:
                    continue
                what = f"{row['where']}: `{claim['call']}`"
                try:
                    errors = dict(vars(builtins), tf=tf)
                    expected = eval(claim["error"], errors)  # pylint: disable=eval-used
                except (NameError, AttributeError):
                    problems.append(f"{what}: {claim['error']} is no error type known here "
                                    f"(a builtin or tf.errors.X)")
                    continue
                try:
                    if claim["setup"]:
                        exec(claim["setup"], namespace)  # pylint: disable=exec-used
                    eval(claim["call"], namespace)  # pylint: disable=eval-used
                except expected:
                    continue
                except Exception as e:  # pylint: disable=broad-except
                    problems.append(f"{what} raised {type(e).__name__} ({e}), not "
                                    f"{claim['error']}")
                    continue
                problems.append(f"{what} raised nothing, not {claim['error']}")
    return problems


def run_probe(tables, env, check_names):
    """Runs probe() in a fresh interpreter with `env` ('VAR=value' or None)."""
    from support import ROOT
    child_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if env:
        var, value = env.split("=", 1)
        child_env[var] = value
    request = json.dumps({"tables": tables, "env": env, "names": check_names})
    result = subprocess.run([sys.executable, os.path.abspath(__file__)], input=request,
                            cwd=ROOT, env=child_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=PROBE_TIMEOUT)
    assert result.returncode == 0, f"the probe failed:\n{result.stderr[-6000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------

def read_doc():
    from support import ROOT
    with open(os.path.join(ROOT, DOC), encoding="utf-8") as f:
        return f.read()


def test_status_tables_match_the_api():
    tables, errors = parse_status_tables(read_doc())
    assert not errors, "rows of docs/migration.md that do not parse:\n" + "\n".join(errors)
    modules = {t["module"] for t in tables}
    assert {"tfring.tensorflow", "tfring.keras"} <= modules, modules
    claims = [c for t in tables for r in t["rows"] for c in r["claims"]]
    assert claims, "no checkable claims: the parser found none"
    problems = run_probe(tables, None, check_names=True)
    for env in sorted({c["env"] for c in claims if c["env"]}):
        problems += run_probe(tables, env, check_names=False)
    assert not problems, "docs/migration.md contradicts the API:\n" + "\n".join(problems)


MALFORMED = [
    ("| `local_*` | Same |", "name cell"),
    ("| `init`, shutdown | Same |", "name cell"),
    ("| `Adasum` | Constant present; using it raises `NotImplementedError` |", "status must"),
    ("| `Adasum` | Same; using it raises `NotImplementedError` |", "outside a checkable"),
    ("| `Adasum` | Same; a `ValueError` for odd ranks |", "outside a checkable"),
    ("| `init` | Same | extra |", "two-column"),
    ("| `f(a, b c)` | Same |", "cannot read parameter"),
]


@pytest.mark.parametrize("row,message", MALFORMED, ids=[m[1] + str(i)
                                                        for i, m in enumerate(MALFORMED)])
def test_malformed_rows_fail(row, message):
    with pytest.raises(DocFormatError, match=message):
        parse_row(row, "row")


def test_sections_are_parsed_strictly():
    table = "\n".join(TABLE_HEADER + ["| `init` | Same |"])
    good = f"{SECTION}\n\n### `horovod.tensorflow` → `tfring.tensorflow`\n\n{table}\n"
    tables, errors = parse_status_tables(good)
    assert not errors and tables[0]["rows"][0]["names"][0]["name"] == "init"
    _, errors = parse_status_tables(good + "| `local_*` | Same |\n| `size` | Same; raises |\n")
    assert len(errors) == 2 and "name cell" in errors[0] and "raises" in errors[1], errors
    for bad, message in [
            (good.replace("→", "->"), "heading not of the form"),
            (good.replace("| Name | Status |", "| Name | State |"), "table header"),
            (good + "\nA note under the table.\n", "text after the table"),
            (good.replace("### `horovod.tensorflow` → `tfring.tensorflow`\n\n", ""),
             "outside a '### '"),
            ("no section here\n", "exactly one")]:
        with pytest.raises(DocFormatError, match=message):
            parse_status_tables(bad)


def test_signatures_and_claims_are_checked():
    """The probe finds a missing name, wrong defaults and order, a claim whose
    call raises another error or nothing, an unknown error type: what the old
    doc's Adasum row said, written as a checkable claim, fails."""
    rows = [parse_row(line, f"row{i}") for i, line in enumerate([
        "| `no_such_name` | Same |",
        "| `init(process_sets=None, comm=None)` | Same |",
        "| `start_timeline(file_path, mark_cycles=True)` | Same |",
        "| `start_timeline(file_path)` | Same |",
        "| `Adasum` | Same; after `init()`, `allreduce(tf.constant([1.0]), op=Adasum)` "
        "raises `NotImplementedError` |",
        "| `Sum` | Same; `broadcast_global_variables(0)` raises `ValueError` |",
        "| `Sum` | Same; `size()` raises `NoSuchError` |",
    ])]
    problems = run_probe([{"module": "tfring.tensorflow", "rows": rows}], None,
                         check_names=True)
    expected = ["row0: tfring.tensorflow.no_such_name does not exist",
                "row1: tfring.tensorflow.init takes ['process_sets', 'comm'] in the order",
                "row2: tfring.tensorflow.start_timeline mark_cycles defaults to False",
                "row3: tfring.tensorflow.start_timeline takes ['file_path', 'mark_cycles'], "
                "not just",
                "row4: `allreduce(tf.constant([1.0]), op=Adasum)` raised nothing",
                "row5: `broadcast_global_variables(0)` raised RuntimeError",
                "row6: `size()`: NoSuchError is no error type"]
    assert len(problems) == len(expected), problems
    for got, want in zip(problems, expected):
        assert got.startswith(want), (got, want)


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.stdin.read()))))
