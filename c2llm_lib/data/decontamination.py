"""Decontamination (section 4.1): the rules a training row may break, in the order checked, the keys each compares
(`EvalKeys`) and MTEB(Code, v1)'s test keys. Why each rule: docs/data.md#decontamination."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import SOURCE_NAMES
from ..retrieval import corpus_text
from .records import DataError, text_key

# the 12 tasks of MTEB(Code, v1), in mteb's order: the hub sources are their train splits (config.SOURCE_NAMES)
MTEB_CODE_TASKS = tuple(sorted(SOURCE_NAMES, key=str.lower))

QUERY_IS_TEST_QUERY = "query is a test query"
POSITIVE_IS_RELEVANT = "positive is a relevant test document"
QUERY_IS_RELEVANT = "query is a relevant test document"  # a test pair read backwards (a swap=True source)
POSITIVE_IS_TEST_QUERY = "positive is a test query"
OFFLINE_EVAL_TEXT = "offline evaluation text"
# checked in this order
RULES = (QUERY_IS_TEST_QUERY, POSITIVE_IS_RELEVANT, QUERY_IS_RELEVANT, POSITIVE_IS_TEST_QUERY, OFFLINE_EVAL_TEXT)
HELDOUT_TEXT = "held-out text"  # checked after RULES, only where a run holds rows out (data_source: files, code)
BEIR_TEXT = "BEIR set text"  # checked after the held-out rule, only where a run scores BEIR sets (beir_sets)
UNSEEN_TEXT = "unseen-library text"  # checked last, only where a run evaluates unseen libraries (unseen_packages)


@dataclass(frozen=True)
class SetKeys:
    """Sets a run scores beside MTEB (BEIR folders, unseen libraries' pins as text) and the `text_key`s of their
    queries and documents, each kind kept out of training by a rule of its own (`BEIR_TEXT`, `UNSEEN_TEXT`)."""

    names: tuple[str, ...] = ()
    keys: frozenset[str] = frozenset()


NO_SETS = SetKeys()  # a run that scores no such set


@dataclass(frozen=True)
class EvalKeys:
    """The `text_key`s a training row must not match, one set per decontamination rule."""

    test_queries: frozenset[str] = frozenset()
    relevant_documents: frozenset[str] = frozenset()
    offline: frozenset[str] = frozenset()
    heldout: frozenset[str] = frozenset()  # keys of the queries, positives (and code bodies) a run holds out
    beir: frozenset[str] = frozenset()  # keys of the judged queries and relevant documents of the run's BEIR sets
    unseen: frozenset[str] = frozenset()  # keys of the queries and documents of the unseen libraries' tasks

    @classmethod
    def of(
        cls,
        offline_texts: Iterable[str] = (),
        mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
        heldout_keys: Iterable[str] = (),
        beir_keys: Iterable[str] = (),
        unseen_keys: Iterable[str] = (),
    ) -> EvalKeys:
        """From offline texts, `mteb_test_keys`' pair, and the held-out, BEIR and unseen-library keys."""
        test_queries, relevant_documents = mteb_keys
        offline = frozenset(map(text_key, offline_texts))
        return cls(frozenset(test_queries), frozenset(relevant_documents), offline, frozenset(heldout_keys),
                   frozenset(beir_keys), frozenset(unseen_keys))  # fmt: skip

    def rule(self, query: str, positive: str, body_key: str = "") -> str | None:
        """The first rule a (query, positive) row breaks, or None; its `body_key` ("" for none) is checked too."""
        q, p = text_key(query), text_key(positive)
        if q in self.test_queries:
            return QUERY_IS_TEST_QUERY
        if p in self.relevant_documents:
            return POSITIVE_IS_RELEVANT
        if q in self.relevant_documents:
            return QUERY_IS_RELEVANT
        if p in self.test_queries:
            return POSITIVE_IS_TEST_QUERY
        if q in self.offline or p in self.offline:
            return OFFLINE_EVAL_TEXT
        if q in self.heldout or p in self.heldout or (body_key and body_key in self.heldout):
            return HELDOUT_TEXT
        if q in self.beir or p in self.beir:
            return BEIR_TEXT
        if q in self.unseen or p in self.unseen:
            return UNSEEN_TEXT
        return None

    def fingerprint(self) -> str:
        """A hash of the rules and every key; the held-out, BEIR and unseen rules enter only when they have keys."""
        h = hashlib.sha256(json.dumps(RULES).encode())
        for keys in (self.test_queries, self.relevant_documents, self.offline):
            h.update(b"\x00" + "\n".join(sorted(keys)).encode())
        for rule, keys in ((HELDOUT_TEXT, self.heldout), (BEIR_TEXT, self.beir), (UNSEEN_TEXT, self.unseen)):
            if keys:
                h.update(b"\x00" + rule.encode() + b"\x00" + "\n".join(sorted(keys)).encode())
        return h.hexdigest()


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{what}: expected a text, got {type(value).__name__} {str(value)[:80]!r}")
    return value


def split_keys(split: dict[str, Any], where: str) -> tuple[set[str], set[str]]:
    """(test-query keys, relevant-document keys) of one mteb 2.x split (`queries`, `corpus`, `relevant_docs`)."""
    missing = [k for k in ("queries", "corpus", "relevant_docs") if k not in split]
    if missing:
        raise DataError(f"{where}: the split has no {missing}; a retrieval split needs queries, corpus, relevant_docs")
    query_rows = zip(split["queries"]["id"], split["queries"]["text"], strict=True)
    queries = {text_key(_text(text, f"{where} query {query_id}")) for query_id, text in query_rows}
    relevant = {str(d) for docs in split["relevant_docs"].values() for d, score in docs.items() if score > 0}
    corpus = split["corpus"]  # read only the relevant rows' texts: a CodeSearchNet corpus has ~1M documents
    hits = corpus.select([i for i, doc_id in enumerate(corpus["id"]) if str(doc_id) in relevant])
    titles = hits["title"] if "title" in hits.column_names else [None] * len(hits)
    documents: set[str] = set()
    for doc_id, text, title in zip(hits["id"], hits["text"], titles, strict=True):
        text = _text(text, f"{where} document {doc_id}")
        documents |= {text_key(corpus_text(text, title or "")), text_key(text)}  # as the model sees it; bare
    return queries, documents


def mteb_test_keys(tasks: Sequence[Any] = MTEB_CODE_TASKS) -> tuple[frozenset[str], frozenset[str]]:
    """(keys of every test query, keys of every relevant test document) over the tasks' evaluated splits."""
    import mteb

    names = [t for t in tasks if isinstance(t, str)]
    objects = [t for t in tasks if not isinstance(t, str)] + (list(mteb.get_tasks(tasks=names)) if names else [])
    queries: set[str] = set()
    documents: set[str] = set()
    for task in objects:
        name = getattr(getattr(task, "metadata", None), "name", type(task).__name__)
        try:
            task.load_data()
            if hasattr(task, "convert_v1_dataset_format_to_v2"):
                task.convert_v1_dataset_format_to_v2(num_proc=None)  # no-op for a task loaded in the v2 format
        except Exception as err:
            raise DataError(f"MTEB task {name}: could not load its test data ({err})") from err
        dataset = getattr(task, "dataset", None)
        if not isinstance(dataset, dict) or not dataset:
            raise DataError(f"MTEB task {name}: load_data left no `dataset` ({{subset: {{split: ...}}}}) to read")
        for subset, splits in dataset.items():
            for split in task.metadata.eval_splits:
                if split in splits:
                    q, d = split_keys(splits[split], f"MTEB task {name}, subset {subset}, split {split}")
                    queries |= q
                    documents |= d
    return frozenset(queries), frozenset(documents)


def clean_rows(rows: Iterable[dict], keys: EvalKeys, counts: dict[str, Counter]) -> Iterator[dict]:
    """The clean rows, each dropped one counted by source and rule; a row's `body_key` is compared, then removed."""
    for row in rows:
        rule = keys.rule(row["query"], row["positive"], row.pop("body_key", ""))
        if rule is not None:
            counts[row["dataset"]][rule] += 1
            continue
        yield row
