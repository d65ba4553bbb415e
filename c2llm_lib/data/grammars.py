"""Functions and their documentation (a Python docstring or the comment directly above), found with tree-sitter
grammars, and `summary_of`, CodeSearchNet's query (section 4.1 data): docs/own-data.md#your-own-code."""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import tree_sitter

from .offline import first_paragraph

FUNCTION_LIKE = ("function_expression", "function", "arrow_function", "generator_function")  # JS values
_JS_FUNCTIONS = (
    "function_declaration", "generator_function_declaration", "method_definition", "variable_declarator",
    "assignment_expression", "pair",
)  # fmt: skip


@dataclass(frozen=True)
class Grammar:
    """One language: its tree-sitter wheel, file extensions, function node types and documentation style."""

    language: str  # the record's language (entries.LANGUAGES)
    module: str  # the PyPI wheel's module, e.g. tree_sitter_python
    entry: str  # the module's function returning the language
    extensions: tuple[str, ...]
    functions: tuple[str, ...]  # node types of a function definition
    line_doc: tuple[str, ...] = ()  # a run of line comments starting with one of these is documentation
    block_doc: tuple[str, ...] = ("/**",)  # a block comment starting with one of these is documentation
    not_doc: tuple[str, ...] = ("/**/",)  # comments starting with these are not documentation
    attached: tuple[str, ...] = ()  # sibling node types between the documentation and the function (decorators)
    wrappers: tuple[str, ...] = ()  # parent node types that belong to the function (export, template)


GRAMMARS = (
    Grammar("python", "tree_sitter_python", "language", (".py",), ("function_definition",), block_doc=(),
            wrappers=("decorated_definition",)),
    Grammar("javascript", "tree_sitter_javascript", "language", (".js", ".mjs", ".cjs", ".jsx"),
            _JS_FUNCTIONS + ("field_definition",), wrappers=("export_statement",)),
    Grammar("typescript", "tree_sitter_typescript", "language_typescript", (".ts", ".mts", ".cts"),
            _JS_FUNCTIONS + ("public_field_definition",), attached=("decorator",), wrappers=("export_statement",)),
    Grammar("typescript", "tree_sitter_typescript", "language_tsx", (".tsx",),
            _JS_FUNCTIONS + ("public_field_definition",), attached=("decorator",), wrappers=("export_statement",)),
    Grammar("java", "tree_sitter_java", "language", (".java",), ("method_declaration", "constructor_declaration")),
    Grammar("php", "tree_sitter_php", "language_php", (".php",), ("function_definition", "method_declaration")),
    Grammar("go", "tree_sitter_go", "language", (".go",), ("function_declaration", "method_declaration"),
            line_doc=("//",), block_doc=("/*",)),
    Grammar("ruby", "tree_sitter_ruby", "language", (".rb",), ("method", "singleton_method"), line_doc=("#",),
            block_doc=()),
    Grammar("c", "tree_sitter_c", "language", (".c", ".h"), ("function_definition",), line_doc=("//",),
            block_doc=("/*",)),
    Grammar("c++", "tree_sitter_cpp", "language", (".cc", ".cpp", ".cxx", ".c++", ".hpp", ".hh", ".hxx"),
            ("function_definition",), line_doc=("//",), block_doc=("/*",), wrappers=("template_declaration",)),
    Grammar("c#", "tree_sitter_c_sharp", "language", (".cs",), ("method_declaration", "constructor_declaration"),
            line_doc=("///",), not_doc=("/**/", "////")),
    Grammar("rust", "tree_sitter_rust", "language", (".rs",), ("function_item",), line_doc=("///",),
            not_doc=("/**/", "////", "/***"), attached=("attribute_item",)),
)  # fmt: skip
BY_EXTENSION = {ext: g for g in GRAMMARS for ext in g.extensions}
COMMENTS = frozenset({"comment", "line_comment", "block_comment"})


@dataclass
class Function:
    """One function of a file: its name, 1-based lines, documentation and code without it."""

    name: str
    start_line: int
    end_line: int
    doc: str  # the documentation's text, comment markers included (summary_of cleans it); "" when undocumented
    code: str  # dedented, without a Python docstring
    docstring: bool = False  # the documentation is a docstring, not a comment
    body: str = ""  # the code of the grammar's body node: no name, signature or decorator; "" if it has none


@cache
def parser_for(grammar: Grammar) -> tuple[Any, Any]:
    """(tree_sitter.Parser, tree_sitter.Query matching the grammar's function nodes), built once per process."""
    module = importlib.import_module(grammar.module)
    language = tree_sitter.Language(getattr(module, grammar.entry)())
    query = tree_sitter.Query(language, "[" + " ".join(f"({t})" for t in grammar.functions) + "] @function")
    return tree_sitter.Parser(language), query


def error_line(root: Any) -> int:
    """The 1-based line of the first syntax error (an ERROR or MISSING node) under `root`."""
    node = root
    while not (node.is_error or node.is_missing):
        child = next((c for c in node.children if c.has_error or c.is_missing), None)
        if child is None:
            break
        node = child
    return node.start_point.row + 1


def _last_row(node: Any) -> int:
    """The last line a node covers (a line comment's node can end at column 0 of the next line)."""
    end = node.end_point
    return end.row - 1 if end.column == 0 and end.row > node.start_point.row else end.row


def _name(node: Any, source: bytes) -> str | None:
    kind = node.type
    if kind == "assignment_expression":
        target = node.child_by_field_name("left")
        target = target.child_by_field_name("property") or target if target is not None else None
    elif kind == "pair":
        target = node.child_by_field_name("key")
    elif kind == "field_definition":
        target = node.child_by_field_name("property")
    elif kind == "function_definition" and node.child_by_field_name("declarator") is not None:  # C, C++
        target = node.child_by_field_name("declarator")
        while target is not None and target.type != "function_declarator":
            target = target.child_by_field_name("declarator")
        target = target.child_by_field_name("declarator") if target is not None else None
    else:
        target = node.child_by_field_name("name")
    if target is None:
        return None
    return source[target.start_byte : target.end_byte].decode("utf-8").strip("'\"`")


_VALUE_FIELD = {"variable_declarator": "value", "assignment_expression": "right", "pair": "value",
                "field_definition": "value", "public_field_definition": "value"}  # fmt: skip


def _is_function(node: Any) -> bool:
    """Whether a match defines a function: a JavaScript declarator, assignment, pair or field must hold one."""
    value_field = _VALUE_FIELD.get(node.type)
    if value_field is None:
        return True
    value = node.child_by_field_name(value_field)
    return value is not None and value.type in FUNCTION_LIKE


def _body(node: Any) -> Any:
    holder = node.child_by_field_name(_VALUE_FIELD[node.type]) if node.type in _VALUE_FIELD else node
    return holder.child_by_field_name("body") if holder is not None else None


def _outer(node: Any, grammar: Grammar) -> Any:
    """The node holding the function with what belongs to it (declaration, decorators, `export`, `template<...>`)."""
    if node.type == "variable_declarator" and node.parent is not None and node.parent.named_child_count == 1:
        node = node.parent
    elif node.type == "assignment_expression" and getattr(node.parent, "type", None) == "expression_statement":
        node = node.parent
    while node.parent is not None and node.parent.type in grammar.wrappers:
        node = node.parent
    return node


def _first_attached(node: Any, grammar: Grammar) -> Any:
    """The first of the decorator or attribute siblings directly above `node` (TypeScript, Rust), else `node`."""
    while True:
        prev = node.prev_named_sibling
        if prev is None or prev.type not in grammar.attached or _last_row(prev) + 1 < node.start_point.row:
            return node
        node = prev


def _previous(node: Any) -> Any:
    """The named node before `node`; for a Ruby method first in its class body, the comment before that body."""
    prev = node.prev_named_sibling
    if prev is None and node.parent is not None and node.parent.type == "body_statement":
        prev = node.parent.prev_named_sibling
    return prev


def _comment_doc(top: Any, source: bytes, grammar: Grammar) -> str | None:
    run: list[str] = []
    below = top.start_point.row
    node = _previous(top)
    while node is not None and node.type in COMMENTS and _last_row(node) + 1 == below:
        before = node.prev_sibling
        if before is not None and before.type not in COMMENTS and _last_row(before) == node.start_point.row:
            break  # a trailing comment of the code before it
        text = source[node.start_byte : node.end_byte].decode("utf-8").rstrip()
        if text.startswith(grammar.not_doc):
            break
        if text.startswith(grammar.block_doc):
            if run:
                break  # a block comment above a run of line comments documents something else
            return text
        if not grammar.line_doc or not text.startswith(grammar.line_doc):
            break
        run.insert(0, text)
        below = node.start_point.row
        node = _previous(node)
    return "\n".join(run) or None


def _docstring(function: Any, source: bytes) -> tuple[str, Any] | None:
    """(docstring, its statement) of a Python function whose body has a docstring and another statement."""
    body = function.child_by_field_name("body")
    statements = [c for c in (body.named_children if body is not None else []) if c.type != "comment"]
    if len(statements) < 2 or statements[0].type != "expression_statement":
        return None
    first = statements[0]
    string = first.named_children[0] if first.named_child_count == 1 else None
    if string is None or string.type != "string":
        return None
    if first.start_point.row == function.start_point.row or statements[1].start_point.row == _last_row(first):
        return None  # on the line of the `def` or of the next statement: no line of its own to remove
    try:
        value = ast.literal_eval(source[string.start_byte : string.end_byte].decode("utf-8"))
    except (ValueError, SyntaxError):  # an f-string, or a string the grammar accepts and Python does not
        return None
    return (inspect.cleandoc(value), first) if isinstance(value, str) else None


def _lines(source_lines: list[bytes], first: Any, last: Any, drop: tuple[int, int] | None) -> str:
    """The dedented whole lines from `first` to `last` without the rows in `drop`; code before `first` is blanked."""
    start, end = first.start_point, last.end_point
    lines = []
    for row in range(start.row, end.row + 1):
        if drop is not None and drop[0] <= row <= drop[1]:
            continue
        line = source_lines[row]
        if row == end.row:
            line = line[: end.column]
        if row == start.row:
            prefix = line[: start.column]
            line = (prefix if not prefix.strip() else b" " * start.column) + line[start.column :]
        lines.append(line.rstrip(b"\r").decode("utf-8"))
    return textwrap.dedent("\n".join(lines)).rstrip()


def functions(
    tree: Any, source: bytes, grammar: Grammar, counts: dict[str, int], every: bool = False
) -> Iterator[Function]:
    """The documented functions of a parsed file in source order (all with `every`); `counts` gains their counts."""
    _, query = parser_for(grammar)
    nodes = tree_sitter.QueryCursor(query).captures(tree.root_node).get("function", [])
    source_lines = source.split(b"\n")
    for node in sorted(nodes, key=lambda n: n.start_byte):
        if not _is_function(node):
            continue
        counts["functions"] += 1
        name = _name(node, source)
        if not name:
            continue
        outer = _outer(node, grammar)
        top = _first_attached(outer, grammar)
        drop = None
        if grammar.language == "python":
            found = _docstring(node, source)
            doc, statement = found if found is not None else (None, None)
            drop = (statement.start_point.row, _last_row(statement)) if statement is not None else None
        else:
            doc = _comment_doc(top, source, grammar)
        if doc is None and not every:
            continue
        counts["documented"] += doc is not None
        code = _lines(source_lines, top, outer, drop)
        body = _body(node)
        body = _lines(source_lines, body, body, drop) if body is not None else ""
        yield Function(name, top.start_point.row + 1, _last_row(outer) + 1, doc or "", code,
                       grammar.language == "python" and doc is not None, body)  # fmt: skip


_BLOCK_STAR = re.compile(r"^\s*\*+ ?")
_LINE_MARKER = re.compile(r"^\s*(?://[/!]?|#+) ?")
_DIRECTIVE = re.compile(r"^(?:go:|line |export |nolint|\+build|rubocop:|frozen_string_literal:|typed:|-\*-|eslint"
                        r"|prettier-ignore|@ts-|istanbul |NOLINT|noqa|pylint:|type: ?ignore)")  # fmt: skip
_TAG = re.compile(r"^[@\\](\w+)\s*|^:(?:param|type|returns?|rtype|raises?|arg|args|keyword|kwarg|var|ivar|cvar"
                  r"|yields?|except)\b")  # fmt: skip
_SUMMARY_TAGS = frozenset({"brief", "summary", "description", "short"})
_INLINE_TAG = re.compile(r"\{@(?:link|linkplain|code|literal|see)\s+([^}]*)\}|\{@inheritDoc\}")
_XML_REF = re.compile(r"<(?:see|seealso|paramref|typeparamref)\s+(?:cref|name|langword|href)=\"(?:\w:)?([^\"]*)\"\s*/>")
_PARAGRAPH_TAG = re.compile(r"<(?:p|para)\s*/?>", re.I)
_HTML_TAG = re.compile(r"</?(?:p|para|br|b|i|em|strong|code|c|tt|pre|ul|ol|li|a|summary|remarks|value|blockquote"
                       r"|h[1-6]|div|span|sup|sub|u|s)\b[^>]*>", re.I)  # fmt: skip
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.S)


def _marker_free(doc: str, comment: bool) -> list[str]:
    if not comment:
        return doc.split("\n")  # a docstring
    if doc.startswith("/*"):
        body = doc[2:-2] if doc.endswith("*/") and len(doc) >= 4 else doc[2:]
        lines = body.lstrip("*!").split("\n")
        return [lines[0]] + [_BLOCK_STAR.sub("", line) for line in lines[1:]]
    if doc.startswith(("//", "#")):
        return [_LINE_MARKER.sub("", line) for line in doc.split("\n")]
    return doc.split("\n")


def summary_of(doc: str, comment: bool = True) -> str:
    """The query CodeSearchNet makes of a documentation: its first paragraph, without markers and tags."""
    kept = []
    for line in _marker_free(doc, comment):
        stripped = line.strip()
        if _DIRECTIVE.match(stripped):
            continue
        tag = _TAG.match(stripped)
        if tag is not None:
            if tag.group(1) not in _SUMMARY_TAGS:
                break
            line = stripped[tag.end() :]
        kept.append(line.rstrip())
    text = "\n".join(kept)
    summary = _SUMMARY.search(text)
    if summary is not None:
        text = summary.group(1)
    text = _INLINE_TAG.sub(lambda m: m.group(1) or "", text)
    text = _XML_REF.sub(r"\1", text)
    text = _HTML_TAG.sub("", _PARAGRAPH_TAG.sub("\n\n", text))
    return first_paragraph(html.unescape(text))
