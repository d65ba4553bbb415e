"""A local BEIR-layout retrieval set as one task (notebook 04's `beir_sets`, section 4.2), read strictly, and
the keys notebook 01 keeps out of training (`beir_keys`): docs/own-data.md#your-own-retrieval-sets."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..retrieval import RetrievalTask, corpus_text, file_safe
from .decontamination import SetKeys
from .records import DataError, text_key
from .sources import qrel_score

QRELS = ("qrels", "test.tsv")
QRELS_HEADER = ("query-id", "corpus-id", "score")


def _lines(path: Path) -> list[tuple[int, str]]:
    """(1-based line number, text) of each non-blank line; a missing file or bad UTF-8 is an error naming it."""
    if not path.is_file():
        raise DataError(f"{path}: no such file (a BEIR set holds corpus.jsonl, queries.jsonl and qrels/test.tsv)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{path}, line {line}: not UTF-8 ({err.reason} at byte {err.start})") from None
    return [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _field(path: Path, line: int, row: dict[str, Any], key: str, required: bool = True) -> str:
    """Column `key` of a JSON row as a text: an id may be an integer (read as its digits); a text may not be empty."""
    if key not in row or (not required and row[key] is None):
        if not required:  # an absent or null title
            return ""
        raise DataError(f"{path}, line {line}: no column {key!r} (columns: {sorted(row)})")
    value = row[key]
    if key == "_id" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise DataError(f"{path}, line {line}, column {key!r}: expected a text, got {type(value).__name__} "
                        f"{str(value)[:60]!r}")  # fmt: skip
    if required and not value.strip():
        raise DataError(f"{path}, line {line}, column {key!r}: empty")
    return value


def _jsonl(path: Path, keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, tuple[int, dict]]:
    """{_id: (line, {key: text})} of a JSONL file; every error names the file, line and column."""
    rows: dict[str, tuple[int, dict]] = {}
    for line, text in _lines(path):
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}, line {line}: not JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {line}: expected a JSON object, got {type(row).__name__}")
        values = {key: _field(path, line, row, key) for key in ("_id", *keys)}
        values.update({key: _field(path, line, row, key, required=False) for key in optional})
        if values["_id"] in rows:
            raise DataError(f"{path}, line {line}, column '_id': {values['_id']!r} is also on line "
                            f"{rows[values['_id']][0]}")  # fmt: skip
        rows[values["_id"]] = (line, values)
    return rows


def _score(path: Path, line: int, raw: str) -> int:
    value = qrel_score(raw)
    if value is None or value != int(value):  # NaN, infinity and fractions are not integer judgements
        raise DataError(f"{path}, line {line}, column 'score': {raw!r} is not an integer score")
    return int(value)


def _qrels(path: Path, queries: dict, corpus: dict) -> dict[str, dict[str, int]]:
    """{query id: {document id: score}} of a qrels file, every id checked against the queries and the corpus."""
    lines = _lines(path)
    if not lines:
        raise DataError(f"{path}: empty (expected a header {' '.join(QRELS_HEADER)} and one judgement a line)")
    header_line, header = lines[0]
    if tuple(cell.strip() for cell in header.split("\t")) != QRELS_HEADER:
        raise DataError(f"{path}, line {header_line}: the header must be the tab-separated columns "
                        f"{' '.join(QRELS_HEADER)}, got {header.strip()[:80]!r}")  # fmt: skip
    qrels: dict[str, dict[str, int]] = {}
    seen: dict[tuple[str, str], int] = {}
    for line, text in lines[1:]:
        cells = [cell.strip() for cell in text.split("\t")]
        if len(cells) != len(QRELS_HEADER):
            raise DataError(f"{path}, line {line}: expected {len(QRELS_HEADER)} tab-separated cells "
                            f"({', '.join(QRELS_HEADER)}), got {len(cells)}: {text.strip()[:80]!r}")  # fmt: skip
        query, document, raw = cells
        for column, value, known, where in (("query-id", query, queries, "queries.jsonl"),
                                            ("corpus-id", document, corpus, "corpus.jsonl")):  # fmt: skip
            if value not in known:
                raise DataError(f"{path}, line {line}, column {column!r}: {value!r} is not an id of {where}")
        if (query, document) in seen:
            raise DataError(f"{path}, line {line}: the judgement of query {query!r} and document {document!r} is "
                            f"also on line {seen[query, document]}")  # fmt: skip
        seen[query, document] = line
        qrels.setdefault(query, {})[document] = _score(path, line, raw)
    if not qrels:
        raise DataError(f"{path}: no judgement after its header: nothing to evaluate")
    return qrels


def _read(folder: str | Path) -> tuple[Path, dict, dict, dict]:
    root = Path(folder).expanduser()
    if not root.is_dir():
        what = "not a folder" if root.exists() else "no such folder"
        raise DataError(f"BEIR set {str(folder)!r} ({root.resolve()}): {what}; expected corpus.jsonl, queries.jsonl "
                        "and qrels/test.tsv in it")  # fmt: skip
    corpus_rows = _jsonl(root / "corpus.jsonl", ("text",), optional=("title",))
    if not corpus_rows:
        raise DataError(f"{root / 'corpus.jsonl'}: the corpus is empty")
    query_rows = _jsonl(root / "queries.jsonl", ("text",))
    qrels = _qrels(root.joinpath(*QRELS), query_rows, corpus_rows)
    relevant = {q for q, judged in qrels.items() if any(score > 0 for score in judged.values())}
    queries = {q: values["text"] for q, (_, values) in query_rows.items() if q in relevant}
    if not queries:
        raise DataError(f"{root.joinpath(*QRELS)}: no query has a relevant document (a score above 0)")
    return root, queries, corpus_rows, {q: qrels[q] for q in queries}


def read_beir(folder: str | Path, instruction: str) -> RetrievalTask:
    """The BEIR set in `folder` (relative: from the working directory) as the task `beir-<folder name>`."""
    root, queries, corpus_rows, qrels = _read(folder)
    corpus = {d: corpus_text(values["text"], values["title"]) for d, (_, values) in corpus_rows.items()}
    name = file_safe(root.resolve().name)
    return RetrievalTask(f"beir-{name}", queries, corpus, qrels, instruction)


def read_beir_sets(folders: list[str], instruction: str) -> list[RetrievalTask]:
    """`read_beir` of each folder; two folders of one name would make two tasks of one name: an error naming both."""
    tasks, origin = [], {}
    for folder in folders:
        task = read_beir(folder, instruction)
        if task.name in origin:
            raise DataError(f"beir_sets: {origin[task.name]!r} and {folder!r} are both named {task.name!r}; "
                            "rename one folder")  # fmt: skip
        origin[task.name] = folder
        tasks.append(task)
    return tasks


def beir_keys(folders: Sequence[str]) -> SetKeys:
    """The keys of each set's judged queries and relevant documents (as the model sees them and bare), read strictly."""
    keys: set[str] = set()
    for folder in folders:
        _, queries, corpus_rows, qrels = _read(folder)
        relevant = [corpus_rows[d][1] for d in {d for judged in qrels.values() for d, s in judged.items() if s > 0}]
        keys.update(map(text_key, queries.values()))
        keys.update(text_key(corpus_text(d["text"], d["title"])) for d in relevant)  # as the model sees it
        keys.update(text_key(d["text"]) for d in relevant)  # bare
    return SetKeys(tuple(folders), frozenset(keys))
