"""A parsed Python file and the edits made to it.

Every change the migration makes is an :class:`Edit`: a span of the original
text, found from AST node positions (and, inside a statement, its tokens),
and the text that replaces it. Nothing outside a span changes, so strings,
comments and formatting stay as they were. :class:`Finding` is one line of
the report: a fix that was made, or something the user has to change.
"""
import ast
import dataclasses
import io
import tokenize


@dataclasses.dataclass(frozen=True)
class Edit:
    """Replace the characters ``start:end`` of the source with ``text``."""
    start: int
    end: int
    text: str


@dataclasses.dataclass(frozen=True)
class Finding:
    """One report line.

    ``fixed`` findings describe an edit the tool made; the others need a
    person, and ``fix`` says what to do.
    """
    line: int
    message: str
    fix: str = ""
    fixed: bool = False

    def format(self, path):
        if self.fixed:
            return f"{path}:{self.line}: fixed: {self.message}"
        return f"{path}:{self.line}: manual: {self.message}. Fix: {self.fix}"


class Source:
    """The text of one file, its AST, and offsets for AST positions.

    Args:
        text: the file's contents.
        filename: used in syntax errors.

    Raises:
        SyntaxError: the text is not valid Python.
    """

    def __init__(self, text, filename="<string>"):
        self.text = text
        self.tree = ast.parse(text, filename)
        self._line_starts = [0]
        for line in text.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(line))
        self._lines = text.splitlines(keepends=True)

    def offset(self, lineno, col):
        """The string offset of an AST position (``col`` counts UTF-8 bytes)."""
        line = self._lines[lineno - 1] if lineno - 1 < len(self._lines) else ""
        return self._line_starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

    def start(self, node):
        return self.offset(node.lineno, node.col_offset)

    def end(self, node):
        return self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node):
        return self.text[self.start(node):self.end(node)]

    def tokens(self, node):
        """[(type, string, start offset, end offset)] of the tokens inside ``node``'s span."""
        begin = self.start(node)
        found = []
        readline = io.StringIO(self.text[begin:self.end(node)]).readline
        try:
            for tok in tokenize.generate_tokens(readline):
                if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER,
                                tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT):
                    continue
                found.append((tok.type, tok.string, self._local(begin, tok.start),
                              self._local(begin, tok.end)))
        except (tokenize.TokenError, IndentationError):
            pass  # a statement's span cut short (e.g. an open bracket): what we have suffices
        return found

    def _local(self, begin, position):
        # tokenize's (row, col) inside the segment -> offset in the whole text.
        row, col = position
        segment = self.text[begin:]
        offset = 0
        for _ in range(row - 1):
            offset = segment.index("\n", offset) + 1
        return begin + offset + col


def dotted_span(source, node, name, skip=0):
    """(start, end) of the dotted module name ``name`` among ``node``'s
    tokens, after skipping ``skip`` leading keyword tokens."""
    tokens = source.tokens(node)[skip:]
    parts = name.split(".")
    expected = [t for part in parts for t in (part, ".")][:-1]
    for i in range(len(tokens) - len(expected) + 1):
        if [t[1] for t in tokens[i:i + len(expected)]] == expected:
            return tokens[i][2], tokens[i + len(expected) - 1][3]
    raise ValueError(f"no {name!r} in {source.segment(node)!r}")


def apply_edits(text, edits):
    """Applies the edits that do not overlap an earlier-starting one.

    Returns (new text, number applied). Edits left out overlap one that was
    applied; the caller parses the result and runs again to make them.
    """
    chosen = []
    last_end = -1
    for edit in sorted(set(edits), key=lambda e: (e.start, -e.end)):
        if edit.start >= last_end or (edit.start == edit.end == last_end):
            chosen.append(edit)
            last_end = max(last_end, edit.end)
    for edit in reversed(chosen):
        text = text[:edit.start] + edit.text + text[edit.end:]
    return text, len(chosen)


def qualified_name(node, aliases):
    """The dotted name ``node`` stands for, through the file's imports.

    ``aliases`` maps a local name to the module path or object it was
    imported as (``{"tf": "tensorflow", "K": "tensorflow.keras.backend"}``).
    Returns None for anything that is not a chain of attributes on a name.
    """
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def import_aliases(tree):
    """{local name: dotted path} for every import in the file."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def remove_arguments(source, call, arguments):
    """The edits that delete ``arguments`` (keyword nodes of ``call``) with
    their commas, leaving the other arguments' layout and any comment alone."""
    ordered = sorted([*call.args, *call.keywords], key=lambda n: (n.lineno, n.col_offset))
    edits = []
    i = 0
    while i < len(ordered):
        if ordered[i] not in arguments:
            i += 1
            continue
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] in arguments:
            j += 1
        edits.extend(_remove_run(source, call, ordered, i, j))
        i = j + 1
    return edits


def _remove_run(source, call, ordered, first, last):
    # Removes ordered[first..last], a run of adjacent arguments.
    start, end = source.start(ordered[first]), source.end(ordered[last])
    if last + 1 < len(ordered):  # up to the next argument: takes "kw=v, " with it
        following = source.start(ordered[last + 1])
        if "#" not in source.text[start:following]:
            return [Edit(start, following, "")]
    elif first > 0:  # the last ones: from the end of the one before
        previous = source.end(ordered[first - 1])
        if "#" not in source.text[previous:end]:
            return [Edit(previous, end, "")]
    else:  # all of them: their trailing comma too
        rest = source.text[end:source.end(call) - 1]
        if "#" not in source.text[start:end]:
            if rest.lstrip().startswith(","):
                end += rest.index(",") + 1
            return [Edit(start, end, "")]
    # A comment among them: remove each argument and its own comma, nothing between.
    edits = []
    for k in range(first, last + 1):
        node = ordered[k]
        node_end = source.end(node)
        if k + 1 < len(ordered):
            edits.append(Edit(source.start(node), source.text.index(",", node_end) + 1, ""))
        else:
            rest = source.text[node_end:source.end(call) - 1]
            if first == 0 and rest.lstrip().startswith(","):
                node_end += rest.index(",") + 1
            edits.append(Edit(source.start(node), node_end, ""))
            if first > 0:
                comma = source.text.index(",", source.end(ordered[first - 1]))
                edits.append(Edit(comma, comma + 1, ""))
    return edits
