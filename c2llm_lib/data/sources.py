"""The paper's 12 training sources (section 4.1): hub dataset, revision, layout, columns, splits, language and
table 1's instruction; local files as the hub are read line by line (`JsonlTable`), a bad line a counted skip."""

from __future__ import annotations

import codecs
import json
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..files import every_file
from .mirror import check_card, check_own_folder, content_cache, content_digest, relative_note, repo_dir
from .records import DataError, RowChecker, SkipReport, require_columns

CSN_LANGUAGES = ("go", "java", "javascript", "php", "python", "ruby")
CODE_EDIT_LANGUAGES = (
    "c", "c++", "go", "java", "javascript", "php", "python", "ruby", "rust", "scala", "shell", "swift", "typescript",
)  # fmt: skip


@dataclass(frozen=True)
class Source:
    name: str  # the MTEB(Code, v1) task this source trains for
    hub_id: str
    revision: str
    layout: Literal["coir", "coir_multilang", "pairs"]
    instruction: str  # table 1 of the paper
    languages: tuple[str, ...]  # subsets for multi-language layouts; one fixed language otherwise
    train_splits: tuple[str, ...] = ("train",)
    swap: bool = False  # read (document, query) as (query, document)
    query_column: str = "query"  # pairs layout only
    document_column: str = "document"
    id_column: str | None = None
    language_in_data: dict[str, str] | None = None  # pairs layout: directory -> language name


TABLE_1 = {
    "CodeEditSearchRetrieval": "Retrieve the diff code that relevant the following query:",
    "CodeSearchNetRetrieval": "Retrieve the code that solves the following query:",
    "AppsRetrieval": "Given a problem description from a programming contest, retrieve code examples that can assist "
    "in solving it.",
    "CodeFeedbackMT": "Given a multi-turn conversation history that includes both text and code, retrieve relevant "
    "multi-modal answers composed of text and code that address the ongoing discussion.",
    "CodeFeedbackST": "Given a single-turn question composed of text and code, retrieve suitable answers that also mix "
    "text and code to provide helpful feedback.",
    "CodeSearchNetCCRetrieval": "Given an initial code segment, retrieve the subsequent segment that continues the "
    "code.",
    "CodeTransOceanContest": "Given a Python code snippet, retrieve its semantically equivalent version written in "
    "C++.",
    "CodeTransOceanDL": "Given a code snippet, retrieve a semantically equivalent implementation of the same code.",
    "COIRCodeSearchNetRetrieval": "Given a code snippet, retrieve its corresponding document string that summarizes "
    "its functionality.",
    "CosQA": "Given a query from a web search, retrieve code that is helpful in addressing the query.",
    "StackOverflowQA": "Given a question combining text and code, retrieve relevant answers that also contain both "
    "text and code snippets and can address the question.",
    "SyntheticText2SQL": "Given a natural language question, retrieve SQL queries that serve as appropriate responses.",
}

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source("CodeSearchNetRetrieval", "CoIR-Retrieval/CodeSearchNet", "4adc7bc41202b5c13543c9c886a25f340634dab3",
               "coir_multilang", TABLE_1["CodeSearchNetRetrieval"], CSN_LANGUAGES, swap=True),
        Source("COIRCodeSearchNetRetrieval", "CoIR-Retrieval/CodeSearchNet", "4adc7bc41202b5c13543c9c886a25f340634dab3",
               "coir_multilang", TABLE_1["COIRCodeSearchNetRetrieval"], CSN_LANGUAGES),
        Source("CodeSearchNetCCRetrieval", "CoIR-Retrieval/CodeSearchNet-ccr",
               "6e1effa2c03723c5fde48ee912b5ee08d4f211e8", "coir_multilang", TABLE_1["CodeSearchNetCCRetrieval"],
               CSN_LANGUAGES),
        Source("AppsRetrieval", "CoIR-Retrieval/apps", "f22508f96b7a36c2415181ed8bb76f76e04ae2d5", "coir",
               TABLE_1["AppsRetrieval"], ("python",)),
        Source("CodeFeedbackST", "CoIR-Retrieval/codefeedback-st", "d213819e87aab9010628da8b73ab4eb337c89340", "coir",
               TABLE_1["CodeFeedbackST"], ("mixed",)),
        Source("CodeFeedbackMT", "CoIR-Retrieval/codefeedback-mt", "b0f12fa0c0dd67f59c95a5c33d02aeeb4c398c5f", "coir",
               TABLE_1["CodeFeedbackMT"], ("mixed",)),
        Source("CodeEditSearchRetrieval", "cassanof/CodeEditSearch", "4e51c66e0939303f6928472f13ad0848b2a3f4c0",
               "pairs", TABLE_1["CodeEditSearchRetrieval"], CODE_EDIT_LANGUAGES, query_column="instruction",
               document_column="diff", id_column="commit"),
        Source("CosQA", "CoIR-Retrieval/cosqa", "bc5efb7e9d437246ce393ed19d772e08e4a79535", "coir",
               TABLE_1["CosQA"], ("python",)),
        Source("StackOverflowQA", "mteb/StackOverflowQA", "7b46f5ebd2365278c1bb025986dda2fee893bbf5", "coir",
               TABLE_1["StackOverflowQA"], ("mixed",)),
        Source("SyntheticText2SQL", "CoIR-Retrieval/synthetic-text2sql", "686b87296c3a0191b5d9415a00526c62db9fce09",
               "coir", TABLE_1["SyntheticText2SQL"], ("sql",)),
        Source("CodeTransOceanContest", "CoIR-Retrieval/codetrans-contest", "20da4eb20a4b17300c0986ee148c90867a7f2a4d",
               "coir", TABLE_1["CodeTransOceanContest"], ("c++",)),
        Source("CodeTransOceanDL", "CoIR-Retrieval/codetrans-dl", "281562cb8a1265ab5c0824bfa6ddcd9b0a15618f", "coir",
               TABLE_1["CodeTransOceanDL"], ("python",)),
    )
}  # fmt: skip


class HubTable:
    """A hub table (a memory-mapped `datasets.Dataset`); rows are addressed by their index."""

    def __init__(self, source: str, label: str, dataset: Any, where: str) -> None:
        self.source, self.label, self.dataset, self.where = source, label, dataset, where

    def rows(self, needed: tuple[str, ...], read: tuple[str, ...]) -> Iterator[tuple[int, str, dict]]:
        """(row number, where it is, {column: value} for the `read` columns the table has), in order."""
        require_columns(self.source, self.label, self.dataset.column_names, needed)
        if len(self.dataset) == 0:
            raise DataError(f"source {self.source}: the {self.label} table {self.where} holds no rows")
        columns = [c for c in read if c in self.dataset.column_names]
        n = 0
        for part in self.dataset.select_columns(columns).iter(batch_size=10_000):
            for values in zip(*(part[c] for c in columns), strict=True):
                yield n, self.locate(n), dict(zip(columns, values, strict=True))
                n += 1

    def locate(self, n: int) -> str:
        return f"{self.label} row {n}"

    def short(self, n: int) -> str:
        return f"row {n}"

    def values(self, numbers: list[int], column: str) -> list:
        return self.dataset.select_columns([column])[numbers][column] if numbers else []


def _parse_line(raw: bytes) -> tuple[dict | None, str, str]:
    """A jsonl line as a JSON object, or None with the skip reason and the detail for the row id."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return None, "line with invalid UTF-8", f" (byte {raw[err.start]:#04x} at column {err.start + 1})"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        return None, "line with malformed JSON", f" ({err.msg.removesuffix(' at')} at column {err.colno})"
    if not isinstance(row, dict):
        return None, "line that is not a JSON object", f" (a JSON {type(row).__name__})"
    return row, "", ""


class JsonlTable:
    """A local jsonl file read line by line: a bad line is a counted skip; only byte offsets and line
    numbers stay in memory."""

    def __init__(self, source: str, label: str, path: Path, what: str, shown: str, report: SkipReport) -> None:
        self.source, self.label, self.path, self.shown, self.report = source, label, path, shown, report
        self.where = f"{path} ({what})"  # names the file, its config and split in errors
        self.offsets = array("q")  # byte offset of each good row's JSON text
        self.line_numbers = array("q")

    def rows(self, needed: tuple[str, ...], read: tuple[str, ...] = ()) -> Iterator[tuple[int, str, dict]]:
        """(row number, file:line, JSON object) of each readable line; a `needed` column must be in some row."""
        self.offsets, self.line_numbers = array("q"), array("q")
        columns: set[str] = set()
        unreadable: list[str] = []
        try:
            handle = self.path.open("rb")
        except OSError as err:
            raise DataError(f"source {self.source}: cannot open the {self.label} file {self.where}: {err}") from err
        with handle:
            offset = 0
            for line_number, raw in enumerate(handle, start=1):
                start, offset = offset, offset + len(raw)
                if line_number == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw, start = raw[len(codecs.BOM_UTF8) :], start + len(codecs.BOM_UTF8)
                if not raw.strip():
                    continue  # a blank line holds no row
                row, reason, detail = _parse_line(raw)
                if row is None:
                    self.report.skip(self.source, reason, f"{self.shown}:{line_number}{detail}")
                    unreadable.append(f"line {line_number}: {reason}{detail}")
                    continue
                self.offsets.append(start)
                self.line_numbers.append(line_number)
                columns.update(row)
                yield len(self.offsets) - 1, self.locate(len(self.offsets) - 1), row
        if not self.offsets and unreadable:
            raise DataError(
                f"source {self.source}: the {self.label} file {self.where} is unreadable: none of its "
                f"{len(unreadable)} line(s) is a JSON object (first: {unreadable[0]})"
            )
        if not self.offsets:
            raise DataError(f"source {self.source}: the {self.label} file {self.where} holds no rows")
        require_columns(self.source, self.label, sorted(columns), needed)

    def locate(self, n: int) -> str:
        return f"{self.shown}:{self.line_numbers[n]}"

    def short(self, n: int) -> str:
        return f"line {self.line_numbers[n]}"

    def values(self, numbers: list[int], column: str) -> list:
        """The `column` value of the given rows, read back from disk in file order."""
        found: dict[int, Any] = {}
        with self.path.open("rb") as handle:
            for n in sorted(set(numbers)):
                handle.seek(self.offsets[n])
                row, reason, _ = _parse_line(handle.readline())
                if row is None:
                    raise DataError(f"source {self.source}: {self.locate(n)} changed while being read ({reason})")
                found[n] = row.get(column)
        return [found[n] for n in numbers]


Table = HubTable | JsonlTable


def open_table(
    source: Source,
    label: str,
    config: str | None,
    split: str,
    local_root: Path | None,
    report: SkipReport,
    data_dir: str | None = None,
) -> Table:
    """One hub table, or its local jsonl stand-in; `label` ("corpus", "qrels[train]") names it in messages."""
    if local_root is not None:
        shown = Path(source.hub_id.replace("/", "__")) / (data_dir or config or "default") / f"{split}.jsonl"
        where = Path(local_root) / shown
        if not where.is_file():
            relative = "" if where.is_absolute() else f"; a relative path is resolved from {Path.cwd()}"
            raise DataError(
                f"source {source.name}: no local file {where} (config {config!r}, split {split!r}{relative})"
            )
        check_own_folder(local_root, source.hub_id, [where], f"source {source.name}")
        return JsonlTable(source.name, label, where, f"config {config!r}, split {split!r}", shown.as_posix(), report)
    import datasets

    what = f"{source.hub_id}@{source.revision[:8]} config {config!r} split {split!r}"
    if data_dir is not None:
        what += f" data_dir {data_dir!r}"
    try:
        table = datasets.load_dataset(source.hub_id, config, revision=source.revision, split=split, data_dir=data_dir)
    except Exception as err:  # network, missing config or split: say which source and what was asked
        raise DataError(
            f"source {source.name}: could not load {what}: {type(err).__name__}: {str(err)[:300]} "
            "(is the hub reachable?)"
        ) from err
    return HubTable(source.name, label, table, what)


def index_ids(table: Table, kind: str, report: SkipReport) -> dict[str, int]:
    """id -> row number of a corpus or queries table; a repeated id keeps its first row and is counted."""
    index: dict[str, int] = {}
    repeats: list[tuple[str, int, int]] = []  # (id, row, its first row)
    for n, where, row in table.rows(("_id", "text"), read=("_id",)):
        key = row.get("_id")
        if key is None or isinstance(key, (list, dict)):
            report.skip(table.source, f"{kind} row without an _id", where)
            continue
        first = index.setdefault(str(key), n)
        if first != n:
            repeats.append((str(key), n, first))
    for start in range(0, len(repeats), 10_000):  # rare: texts are compared only for repeated ids
        part = repeats[start : start + 10_000]
        later = table.values([n for _, n, _ in part], "text")
        earlier = table.values([first for _, _, first in part], "text")
        for (key, n, first), text, first_text in zip(part, later, earlier, strict=True):
            if text == first_text:
                report.skip(table.source, f"repeated {kind} id with the same text", f"{key} at {table.locate(n)}")
            else:
                report.skip(
                    table.source,
                    f"duplicate {kind} id with a different text (the first is used)",
                    f"{key} at {table.locate(n)} (first at {table.short(first)})",
                )
    return index


def qrel_score(score: Any) -> float | None:
    """A qrel's score as a number (null, or no score column, means relevant); None if not a number."""
    if score is None:
        return 1.0
    try:
        value = float(score) if isinstance(score, (int, float, str)) else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _relevant_pairs(
    qrels: Table, source: Source, name: str, index: tuple[dict, dict], report: SkipReport, chunk: int
) -> Iterator[list[tuple[str, str]]]:
    """The (query id, document id) pairs a qrels table marks relevant, `chunk` at a time; bad qrels are counted."""
    query_index, corpus_index = index
    found: list[tuple[str, str]] = []
    for _, where, row in qrels.rows(("query-id", "corpus-id"), read=("query-id", "corpus-id", "score")):
        q, c = row.get("query-id"), row.get("corpus-id")
        if q is None or c is None:
            report.skip(source.name, "qrel without a query-id or corpus-id", where)
            continue
        q, c = str(q), str(c)
        score = qrel_score(row.get("score"))
        if score is None:
            report.skip(
                source.name, "qrel with a non-numeric score", f"{name}:{q}->{c} score {row.get('score')!r} at {where}"
            )
            continue
        if score <= 0:
            continue  # judged not relevant: not a pair
        if q not in query_index or c not in corpus_index:
            report.skip(source.name, "qrel names a missing query or document", f"{q}->{c}")
            continue
        found.append((q, c))
        if len(found) >= chunk:
            yield found
            found = []
    if found:
        yield found


def _coir_subset_records(
    source: Source, checker: RowChecker, local_root: Path | None, subset: str | None, chunk: int
) -> Iterator[dict]:
    report = checker.report
    prefix = f"{subset}-" if subset else ""
    language = subset or source.languages[0]
    corpus = open_table(source, "corpus", f"{prefix}corpus", "corpus", local_root, report)
    queries = open_table(source, "queries", f"{prefix}queries", "queries", local_root, report)
    corpus_index = index_ids(corpus, "corpus", report)  # ids only; texts stay on disk
    query_index = index_ids(queries, "query", report)
    for split in source.train_splits:
        qrels = open_table(
            source, f"qrels[{split}]", f"{prefix}qrels" if subset else "default", split, local_root, report
        )
        name = f"{prefix}{split}"
        for found in _relevant_pairs(qrels, source, name, (query_index, corpus_index), report, chunk):
            q_texts = queries.values([query_index[q] for q, _ in found], "text")
            c_texts = corpus.values([corpus_index[c] for _, c in found], "text")
            for (q, c), q_text, c_text in zip(found, q_texts, c_texts, strict=True):
                query, positive = (c_text, q_text) if source.swap else (q_text, c_text)
                row = checker.record(source.name, f"{name}:{q}->{c}", query, positive, language, source.instruction)
                if row is not None:
                    yield row


def _pairs_records(source: Source, checker: RowChecker, local_root: Path | None) -> Iterator[dict]:
    columns = (source.query_column, source.document_column)
    for language in source.languages:
        for split in source.train_splits:
            table = open_table(
                source, f"{language}/{split}", None, split, local_root, checker.report, data_dir=language
            )
            read = (*columns, source.id_column) if source.id_column else columns
            for n, _, row in table.rows(columns, read=read):
                row_id = f"{language}/{split}:{row.get(source.id_column, n) if source.id_column else n}"
                query, positive = row.get(source.query_column), row.get(source.document_column)
                if source.swap:
                    query, positive = positive, query
                record = checker.record(source.name, row_id, query, positive, language, source.instruction)
                if record is not None:
                    yield record


def iter_records(
    source: Source, checker: RowChecker, local_root: str | Path | None = None, chunk: int = 10_000
) -> Iterator[dict[str, Any]]:
    """Unified records of one source's training split(s), streamed; bad rows are counted by `checker`."""
    root = Path(local_root) if local_root is not None else None
    if source.layout == "pairs":
        yield from _pairs_records(source, checker, root)
        return
    for subset in source.languages if source.layout == "coir_multilang" else (None,):
        yield from _coir_subset_records(source, checker, root, subset, chunk)


# the MTEB tasks of the same datasets, from the hub or a mirror ----------------------------------------------------
def mirrored_task(task, mirror: str | Path):
    """`task` (an mteb task object) reading from the mirror's folder, its revision carrying the `content_digest`."""
    cls = type(task)
    source = cls.metadata.dataset["path"]
    local = repo_dir(mirror, source)
    if not local.is_dir():
        raise DataError(
            f"MTEB task {cls.metadata.name}: the mirror {mirror} has no {local.name}/ "
            f"(the dataset {source} at revision {cls.metadata.dataset.get('revision', '?')[:8]})"
        )
    if not any(s.hub_id == source and s.layout == "pairs" for s in SOURCES.values()):  # read by config name
        check_card(local, f"MTEB task {cls.metadata.name}")
    check_own_folder(mirror, source, every_file(local), f"MTEB task {cls.metadata.name}")
    digest = content_digest(local)
    dataset = {**cls.metadata.dataset, "path": str(local.resolve()),
               "revision": f"{cls.metadata.dataset.get('revision')}+mirror-{digest}"}  # fmt: skip
    metadata = cls.metadata.model_copy(update={"dataset": dataset})

    def load_data(self, *args, **kwargs):
        with content_cache(digest):
            return cls.load_data(self, *args, **kwargs)

    namespace = {"metadata": metadata, "load_data": load_data, "__module__": cls.__module__}
    return type(cls.__name__, (cls,), namespace)()


def mteb_tasks(names: Sequence[str], mirror: str | Path | None = None) -> list:
    """mteb task objects by name: from the hub, or reading from a local mirror folder when one is given."""
    import mteb

    tasks = list(mteb.get_tasks(tasks=list(names)))
    if mirror is None:
        return tasks
    if not Path(mirror).is_dir():
        raise DataError(f"hub_mirror {str(mirror)!r} is not a directory" + relative_note(mirror))
    return [mirrored_task(t, mirror) for t in tasks]
