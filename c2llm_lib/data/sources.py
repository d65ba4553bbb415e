"""The training sources of the paper (section 4.1) and table 1's instructions, one registry entry each.

C2LLM trains on the training splits of the 12 MTEB(Code, v1) sources, about 3 million pairs. Each
entry names the hub dataset and the revision mteb evaluates (so train and test come from one
snapshot), the layout and column mapping, the split(s) that train, the programming language, and the
query instruction of table 1. Layouts:

- "coir": CoIR's BEIR-style configs `corpus` (split `corpus`: _id, title, text), `queries`
  (split `queries`: _id, text) and `default` (qrels per split: query-id, corpus-id, score);
- "coir_multilang": the same per language, configs `<lang>-corpus`, `<lang>-queries`, `<lang>-qrels`,
  the queries carrying a `partition` column (train/valid/test);
- "pairs": one table of (query, document) columns per language directory (CodeEditSearch).

`swap=True` reads a source backwards: CodeSearchNet's text-to-code pairs are CoIR's code-to-text
pairs with query and document exchanged. `iter_records(source, local_root=...)` reads local files
laid out like the hub (`<root>/<hub id with / as __>/<config>/<split>.jsonl`) instead of the hub:
that is how the fixtures test every mapping offline.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .records import DataError, RowChecker, require_columns

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


def load_table(source: Source, config: str | None, split: str, local_root: Path | None, data_dir: str | None = None):
    """One hub table (a `datasets.Dataset`, memory-mapped), or its local stand-in; errors name the source."""
    import datasets

    if local_root is not None:
        where = (
            Path(local_root) / source.hub_id.replace("/", "__") / (data_dir or config or "default") / f"{split}.jsonl"
        )
        if not where.is_file():
            raise DataError(f"source {source.name}: no local file {where} (config {config!r}, split {split!r})")
        return datasets.load_dataset("json", data_files=str(where), split="train")
    try:
        return datasets.load_dataset(source.hub_id, config, revision=source.revision, split=split, data_dir=data_dir)
    except Exception as err:  # network, missing config or split: say which source and what was asked
        raise DataError(
            f"source {source.name}: could not load {source.hub_id}@{source.revision[:8]} config {config!r} "
            f"split {split!r}: {type(err).__name__}: {str(err)[:300]} (is the hub reachable?)"
        ) from err


def _coir_records(source: Source, checker: RowChecker, local_root: Path | None, chunk: int) -> Iterator[dict]:
    subsets = source.languages if source.layout == "coir_multilang" else (None,)
    for subset in subsets:
        prefix = f"{subset}-" if subset else ""
        language = subset or source.languages[0]
        corpus = load_table(source, f"{prefix}corpus", "corpus", local_root)
        queries = load_table(source, f"{prefix}queries", "queries", local_root)
        require_columns(source.name, "corpus", corpus.column_names, ("_id", "text"))
        require_columns(source.name, "queries", queries.column_names, ("_id", "text"))
        corpus_index = {str(i): n for n, i in enumerate(corpus["_id"])}  # ids only; texts stay on disk
        query_index = {str(i): n for n, i in enumerate(queries["_id"])}
        for split in source.train_splits:
            qrels = load_table(source, f"{prefix}qrels" if subset else "default", split, local_root)
            require_columns(source.name, f"qrels[{split}]", qrels.column_names, ("query-id", "corpus-id"))
            for start in range(0, len(qrels), chunk):
                rows = qrels[start : start + chunk]
                scores = rows.get("score") or [1] * len(rows["query-id"])
                pairs = [
                    (str(q), str(c))
                    for q, c, s in zip(rows["query-id"], rows["corpus-id"], scores, strict=True)
                    if s is None or float(s) > 0
                ]
                found = [(q, c) for q, c in pairs if q in query_index and c in corpus_index]
                for q, c in pairs:
                    if q not in query_index or c not in corpus_index:
                        checker.report.skip(source.name, "qrel names a missing query or document", f"{q}->{c}")
                q_texts = queries[[query_index[q] for q, _ in found]]["text"] if found else []
                c_texts = corpus[[corpus_index[c] for _, c in found]]["text"] if found else []
                for (q, c), q_text, c_text in zip(found, q_texts, c_texts, strict=True):
                    query, positive = (c_text, q_text) if source.swap else (q_text, c_text)
                    row = checker.record(
                        source.name, f"{prefix}{split}:{q}->{c}", query, positive, language, source.instruction
                    )
                    if row is not None:
                        yield row


def _pairs_records(source: Source, checker: RowChecker, local_root: Path | None) -> Iterator[dict]:
    for language in source.languages:
        for split in source.train_splits:
            table = load_table(source, None, split, local_root, data_dir=language)
            require_columns(
                source.name, f"{language}/{split}", table.column_names, (source.query_column, source.document_column)
            )
            for n, row in enumerate(table):
                row_id = f"{language}/{split}:{row.get(source.id_column, n) if source.id_column else n}"
                query, positive = row[source.query_column], row[source.document_column]
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
    else:
        yield from _coir_records(source, checker, root, chunk)
