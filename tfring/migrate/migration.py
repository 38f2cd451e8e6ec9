"""One file's migration: the edits of every rule, applied together, and the report."""
import dataclasses
import difflib

from tfring.migrate.imports import rewrite_imports
from tfring.migrate.keras_idioms import fix_keras_idioms
from tfring.migrate.source import Source, apply_edits, import_aliases


@dataclasses.dataclass
class Migration:
    """What migrating one file gives.

    Attributes:
        path: the file's name, as given.
        original: its text before.
        text: its text after the fixes.
        findings: the report, in line order (:class:`tfring.migrate.source.Finding`);
            lines are those of ``original``.
    """
    path: str
    original: str
    text: str
    findings: list

    @property
    def changed(self):
        return self.text != self.original

    @property
    def manual(self):
        """The findings a person has to act on."""
        return [f for f in self.findings if not f.fixed]

    def diff(self):
        """A unified diff from ``original`` to ``text`` ("" when unchanged)."""
        return "".join(difflib.unified_diff(
            self.original.splitlines(keepends=True), self.text.splitlines(keepends=True),
            fromfile=self.path, tofile=self.path))


def migrate_source(text, path="<string>"):
    """Migrates the Python source ``text`` from Horovod and Keras 2 to tfring and Keras 3.

    Every rule looks at the original text; their edits touch disjoint spans
    (an edit inside a removed argument is dropped with it), so one pass
    gives the result, and a second pass over it finds nothing more to do.

    Args:
        text: the file's contents.
        path: its name, for messages.

    Returns:
        a :class:`Migration`.

    Raises:
        SyntaxError: ``text`` is not valid Python.

    Example:
        >>> from tfring.migrate import migrate_source
        >>> result = migrate_source("import horovod.tensorflow.keras as hvd\\n")
        >>> result.text
        'import tfring.keras as hvd\\n'
        >>> [f.format("train.py") for f in result.findings]
        ['train.py:1: fixed: import horovod.tensorflow.keras -> tfring.keras']
    """
    source = Source(text, path)
    import_edits, import_findings = rewrite_imports(source)
    keras_edits, keras_findings = fix_keras_idioms(source, import_aliases(source.tree))
    new_text, _ = apply_edits(text, [*import_edits, *keras_edits])
    findings = sorted(set([*import_findings, *keras_findings]),
                      key=lambda f: (f.line, not f.fixed, f.message))
    return Migration(path, text, new_text, findings)
