"""The layouts of a user's pair files (FlagEmbedding, sentence-transformers, query/positive), detected from their
columns, and their rows read into section 4.1's pairs or `BadRow`s (docs/own-data.md#your-own-pairs)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..entries import LANGUAGES
from .records import DataError, as_text

DEFAULT_LANGUAGE = "mixed"  # a row whose file names no language
LAYOUTS = {  # name: (required columns, what the layout holds)
    "FlagEmbedding": (("query", "pos"), "query, pos (a list), optional neg (a list), prompt or instruction"),
    "sentence-transformers": (
        ("anchor", "positive"),
        "anchor, positive, optional negative, negatives (a list) or negative_1 .. negative_n",
    ),
    "query/positive": (("query", "positive"), "query, positive, optional negatives (a list)"),
}
_NUMBERED = re.compile(r"negative_([0-9]+)")


@dataclass(frozen=True)
class Layout:
    name: str
    query: str
    positive: str
    positive_is_list: bool
    negatives: tuple[tuple[str, bool], ...]  # (column, holds a list) in reading order
    instruction: str | None
    language: str | None
    id: str | None
    group: str | None  # the column that splits the file into groups

    @property
    def columns(self) -> list[str]:
        named = [self.query, self.positive, *(c for c, _ in self.negatives), self.instruction, self.language, self.id]
        return list(dict.fromkeys(c for c in [*named, self.group] if c is not None))


def detect_layout(label: str, columns: Sequence[str], group_column: str | None = None, entry: int = 0) -> Layout:
    """The layout a file's columns match; none, two, or a `group_column` not among them is an error naming the file."""
    matches = [name for name, (needed, _) in LAYOUTS.items() if set(needed) <= set(columns)]
    expected = "; ".join(f"{name} ({what})" for name, (_, what) in LAYOUTS.items())
    if not matches:
        raise DataError(f"data file {label}: its columns {sorted(columns)} match no layout; expected {expected}")
    if len(matches) > 1:
        raise DataError(
            f"data file {label}: its columns {sorted(columns)} match more than one layout ({', '.join(matches)}); "
            "keep the columns of one"
        )
    if "prompt" in columns and "instruction" in columns:
        raise DataError(f"data file {label}: it has both a 'prompt' and an 'instruction' column; keep one")
    if group_column is not None and group_column not in columns:
        raise DataError(
            f"data file {label}: no column {group_column!r} to group by (data_files entry {entry}'s group); "
            f"columns: {sorted(columns)}"
        )
    name = matches[0]
    query, positive = LAYOUTS[name][0]
    if name == "FlagEmbedding":
        negatives = [("neg", True)]
    elif name == "sentence-transformers":
        numbered = sorted((c for c in columns if _NUMBERED.fullmatch(c)), key=lambda c: int(c.split("_")[1]))
        negatives = [("negative", False), ("negatives", True), *((c, False) for c in numbered)]
    else:
        negatives = [("negatives", True)]
    present = tuple((c, is_list) for c, is_list in negatives if c in columns)
    instruction = next((c for c in ("prompt", "instruction") if c in columns), None)
    language, row_id = ("language" if "language" in columns else None), ("id" if "id" in columns else None)
    return Layout(name, query, positive, name == "FlagEmbedding", present, instruction, language, row_id, group_column)


@dataclass(frozen=True)
class FileDefaults:
    """How a file's rows are named in messages, and what they fall back on."""

    label: str  # the file as the user named it
    group: str | None  # every row's group; None: the layout's group column
    instruction: str  # the entry's instruction, else the run's
    instruction_from: str  # "entry" or "default"
    language: str  # the entry's language, else DEFAULT_LANGUAGE
    language_from: str


@dataclass(frozen=True)
class PairRow:
    """A usable row: one query, its positives (one record each) and shared negatives."""

    index: int
    row_id: str  # "<file> row <index> (id <id>)"
    query: str
    positives: list[str]
    negatives: list[str]
    instruction: str
    instruction_from: str  # "row", "entry" or "default"
    language: str
    language_from: str
    group: str


@dataclass(frozen=True)
class BadRow:
    index: int
    row_id: str
    reason: str  # names the column
    source: str  # where the skip is counted: the file's group, or the file for a file split by a column


def _text_problem(value: Any) -> str | None:
    if value is None:
        return "missing value"
    text = as_text(value)
    if text is None:
        return "non-text value"
    return "empty text" if not text.strip() else None


def _texts(value: Any) -> tuple[list[str], str | None]:
    """(texts, problem) of a list-of-texts cell; None is an empty list."""
    if value is None:
        return [], None
    if not isinstance(value, (list, tuple)):
        return [], "not a list of texts"
    if any(_text_problem(v) for v in value):
        return [], "a non-text or empty item"
    return [as_text(v) for v in value], None


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


class RowReader:
    """Turns one file's rows into `PairRow`s and `BadRow`s (each naming the file, row, id and column)."""

    def __init__(self, layout: Layout, defaults: FileDefaults) -> None:
        self.layout, self.defaults = layout, defaults
        self.ids: dict[Any, int] = {}

    def bad(self, i: int, shown: str, problem: str, column: str) -> BadRow:
        return BadRow(i, shown, f"{problem} in column {column!r}", self.defaults.group or self.defaults.label)

    def read(self, i: int, values: dict[str, Any]) -> PairRow | BadRow:
        layout, shown = self.layout, f"{self.defaults.label} row {i}"
        row_id = values.get(layout.id) if layout.id else None
        if row_id is not None:
            if isinstance(row_id, bool) or not isinstance(row_id, (str, int)):
                return self.bad(i, shown, "an id that is not a text or an integer", layout.id)
            if row_id in self.ids:
                detail = f" (id {row_id!r}, first at row {self.ids[row_id]})"
                return self.bad(i, shown + detail, "duplicate id", layout.id)
            self.ids[row_id] = i
            shown += f" (id {row_id!r})"
        problem = _text_problem(values[layout.query])
        if problem:
            return self.bad(i, shown, problem, layout.query)
        if layout.positive_is_list:
            positives, problem = _texts(values[layout.positive])
            problem = problem or (None if positives else "no positive")
        else:
            problem = _text_problem(values[layout.positive])
            positives = [] if problem else [as_text(values[layout.positive])]
        if problem:
            return self.bad(i, shown, problem, layout.positive)
        negatives: list[str] = []
        for column, is_list in layout.negatives:
            texts, problem = self._negatives(values[column], is_list)
            if problem:
                return self.bad(i, shown, problem, column)
            negatives += texts
        return self._finish(i, shown, values, as_text(values[layout.query]), positives, negatives)

    @staticmethod
    def _negatives(value: Any, is_list: bool) -> tuple[list[str], str | None]:
        if is_list:
            return _texts(value)
        if _blank(value):  # an empty CSV cell: this row has fewer negatives
            return [], None
        problem = _text_problem(value)
        return ([] if problem else [as_text(value)]), problem

    def _finish(
        self, i: int, shown: str, values: dict, query: str, positives: list, negatives: list
    ) -> PairRow | BadRow:
        layout, defaults = self.layout, self.defaults
        instruction = values.get(layout.instruction) if layout.instruction else None
        if not _blank(instruction) and as_text(instruction) is None:
            return self.bad(i, shown, "non-text value", layout.instruction)
        own_instruction = not _blank(instruction)
        language = values.get(layout.language) if layout.language else None
        if not _blank(language) and not isinstance(language, str):
            return self.bad(i, shown, "non-text value", layout.language)
        own_language = not _blank(language)
        if own_language and language.strip().lower() not in LANGUAGES:
            return self.bad(i, shown, f"unknown language {language.strip().lower()!r}", layout.language)
        group = defaults.group
        if group is None:
            value = values[layout.group]
            if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
                return self.bad(i, shown, "missing, empty or non-text group", layout.group)
            group = str(value).strip()
        return PairRow(
            i, shown, query, positives, negatives,
            as_text(instruction) if own_instruction else defaults.instruction,
            "row" if own_instruction else defaults.instruction_from,
            language.strip().lower() if own_language else defaults.language,
            "row" if own_language else defaults.language_from,
            group,
        )  # fmt: skip


def read_rows(table: Any, layout: Layout, defaults: FileDefaults, batch: int = 1_000) -> Iterator[PairRow | BadRow]:
    """Every row of a `datasets.Dataset` in order; a file with no usable row is an error listing why."""
    reader, usable, reasons = RowReader(layout, defaults), 0, Counter()
    for i, values in _values(table.select_columns(layout.columns), batch, reader):
        item = reader.read(i, values) if isinstance(values, dict) else values
        usable += isinstance(item, PairRow)
        if isinstance(item, BadRow):
            reasons[item.reason] += 1
        yield item
    if not usable:
        why = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
        raise DataError(f"data file {defaults.label}: none of its {len(table)} rows is usable ({why})")


def _values(table: Any, batch: int, reader: RowReader) -> Iterator[tuple[int, dict[str, Any] | BadRow]]:
    """(row index, {column: value}) of every row; a value Arrow holds as invalid UTF-8 comes as a `BadRow`."""
    columns = table.column_names
    for start in range(0, len(table), batch):
        try:
            part = table[start : start + batch]
        except UnicodeDecodeError:
            for i in range(start, min(start + batch, len(table))):
                try:
                    yield i, table[i]
                except UnicodeDecodeError:
                    column = next(c for c in columns if _undecodable(table, c, i))
                    yield i, reader.bad(i, f"{reader.defaults.label} row {i}", "invalid UTF-8", column)
            continue
        for n, values in enumerate(zip(*(part[c] for c in columns), strict=True)):
            yield start + n, dict(zip(columns, values, strict=True))


def _undecodable(table: Any, column: str, i: int) -> bool:
    try:
        table.select_columns([column])[i]
    except UnicodeDecodeError:
        return True
    return False
