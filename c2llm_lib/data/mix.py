"""Preparing the training mix at scale: streaming, decontamination, hard negatives, caching (section 4.1).

Rows stream from each source through the record checks (`RowChecker`) and the decontamination
filter straight into an Arrow table on disk (`datasets.Dataset.from_generator`), so memory does not
grow with the number of rows beyond a few small hash sets and id indexes. Negatives are mined one
(dataset, language) group at a time, in shards of at most `shard_size` rows, so memory stays bounded
by the shard, not the mix.

Decontamination compares `records.text_key`s (normalised text) and drops a training row when
  (a) its query is a test query of an evaluated split ("query is a test query"),
  (b) its positive is a document that a test qrel marks relevant, score > 0 ("positive is a relevant
      test document"),
  (a', b') the same pair read backwards: its query is a relevant test document ("query is a relevant test
      document") or its positive a test query ("positive is a test query"),
  (c) its query or positive is an offline evaluation text ("offline evaluation text"), or
  (d) its query or positive is a query or positive of the rows a run holds out to evaluate on ("held-out text",
      `data_source: files` and `code`, listed only where rows are held out: `Prepared.heldout`); in a code run also
      when its function's body (the code after the name and signature, `code_trees.body_key`) is a held-out
      function's, so a renamed copy of a held-out function does not train, or
  (e) its query or positive is a judged query or a relevant document (score > 0, as the model sees it and bare) of
      a BEIR set the run scores in notebook 04 ("BEIR set text", `beir_sets`, `beir.beir_keys`; listed only where
      the run names BEIR sets): either text in either place, so a set built from the run's own pairs trains on
      none of them, or
  (f) its query or positive is a query or a document of the tasks mined from the libraries the run evaluates as
      unseen ("unseen-library text", `unseen_packages`, `unseen.unseen_keys`; listed only where the run names such
      packages): every document of their corpora counts, not only the relevant ones, since each is the library's code,
counting each dropped row once, under the first rule that hits, per source (`Prepared.summary()`).
Why both directions: CoIR's CodeSearchNet pairs train both ways (code -> docstring, and docstring -> code
through `swap=True` in `sources.py`), and mteb evaluates both (COIRCodeSearchNetRetrieval asks with the code,
CodeSearchNetRetrieval with the docstring). For a test pair (code X, docstring Y), (a) and (b) drop the copy
(X, Y), and only (a') and (b') drop (Y, X): without them the test answer trains as a query.
The MTEB(Code, v1) keys come from `mteb_test_keys`. A test document is compared both as the model
sees it (`title + " " + text`, as mteb builds it) and as its bare text.

Why not every test corpus document: mteb gives a CoIR task's whole corpus (train and valid documents
included) for its test split, e.g. AppsRetrieval's 8,765 documents for 3,765 test queries, so
matching the corpus dropped every CoIR training row and emptied the paper's training set. A corpus
document that no test query retrieves as relevant is a distractor, not a leaked answer.

CodeEditSearchRetrieval: mteb evaluates it on its *train* split, on the first 1,000 rows of each of
its 13 language directories (a sample, not all rows): those rows' instructions are the test queries
and their diffs the relevant documents. Rule (a) and (b) drop those up to 13,000 pairs from this
source and also every other row whose instruction equals one of theirs (short commit messages such as
"Fix typo" recur); the rest of the split trains. The paper trains on the train splits of all 12
tasks, evaluated rows of this one included, so its published CodeEditSearch score is not clean: the
reference's "clean" mean leaves CodeEditSearch out, and a comparison with the paper should too.

What the report counts per source (`Prepared.summary()`, `metrics/data.json`): `passed_checks`, the rows that
passed the record checks; `decontaminated`, per rule; `capped`, the rows a cap per (dataset, language) group left
out after decontamination (hub sources; the offline snapshot is capped before the checks); and `kept`, the rows of
the prepared table, the ones that train: passed_checks = kept + decontaminated + capped.

Hard negatives (`add_hard_negatives`) are mined per group and replace a row's negatives, except with
`keep_given` (a user's files), where a row's own negatives stay, at most K, and are topped up by mining.

A prepared mix is cached under `cache_dir/<fingerprint>/` (the Arrow table and its report), where
the fingerprint hashes the sources, their revisions, every option, the data format version and the
decontamination keys and rules; the same request is read back instead of being rebuilt.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import hashlib
import json
import shutil
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import SOURCE_NAMES
from ..retrieval import corpus_text
from .beir import BeirKeys
from .negatives import mine_negatives, own_negatives, top_up_negatives
from .records import DataError, RowChecker, SkipReport, text_key
from .sources import SOURCES, iter_records

# 2: decontamination by rule (test queries, relevant documents, offline); 3: both directions; 4: a pair whose query
# equals its positive is skipped, held-out function bodies and BEIR sets are decontaminated against
DATA_FORMAT_VERSION = 4
# MTEB(Code, v1)'s 12 tasks, in mteb's order: the 12 hub sources, whose train splits C2LLM trained on
MTEB_CODE_TASKS = tuple(sorted(SOURCE_NAMES, key=str.lower))


def features():
    from datasets import Features, List, Value

    text = Value("string")
    return Features(
        {
            "dataset": text,
            "language": text,
            "query": text,
            "positive": text,
            "negatives": List(text),
            "instruction": text,
        }
    )


def fingerprint_of(*parts: Any) -> str:
    blob = json.dumps([DATA_FORMAT_VERSION, *parts], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


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
class UnseenKeys:
    """The unseen libraries a run evaluates (`unseen.PackagePin`s as text: name, version and the wheel's sha256) and
    the `text_key`s of their tasks' queries and documents, which notebook 01 keeps out of training (`UNSEEN_TEXT`)."""

    packages: tuple[str, ...] = ()
    keys: frozenset[str] = frozenset()


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
        """From offline evaluation texts, `mteb_test_keys`' (test-query keys, relevant-document keys), the keys of
        the held-out rows' texts (and, in a code run, of their functions' bodies), those of the BEIR sets and those of
        the unseen libraries' tasks."""
        test_queries, relevant_documents = mteb_keys
        offline = frozenset(map(text_key, offline_texts))
        return cls(frozenset(test_queries), frozenset(relevant_documents), offline, frozenset(heldout_keys),
                   frozenset(beir_keys), frozenset(unseen_keys))  # fmt: skip

    def rule(self, query: str, positive: str, body_key: str = "") -> str | None:
        """The first rule a (query, positive) row breaks, or None if it is clean; `body_key` is the key of its
        function's body (`code_trees.body_key`; "" for none), compared with the held-out keys."""
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
        """A hash of the rules and of every key of every set (not their sizes: equal sizes, other keys); the held-out,
        BEIR and unseen-library rules enter only when they have keys, so a run without them keeps its earlier
        fingerprint."""
        h = hashlib.sha256(json.dumps(RULES).encode())
        for keys in (self.test_queries, self.relevant_documents, self.offline):
            h.update(b"\x00" + "\n".join(sorted(keys)).encode())
        for rule, keys in ((HELDOUT_TEXT, self.heldout), (BEIR_TEXT, self.beir), (UNSEEN_TEXT, self.unseen)):
            if keys:
                h.update(b"\x00" + rule.encode() + b"\x00" + "\n".join(sorted(keys)).encode())
        return h.hexdigest()


def rows_per_source(table) -> Counter:
    """Rows of each source (the `dataset` column) of a table, counted in Arrow batches (no text is read)."""
    import pyarrow.compute as pc

    counts: Counter = Counter()
    for batch in table.select_columns(["dataset"]).with_format("arrow").iter(batch_size=65_536):
        counts.update({e["values"]: e["counts"] for e in pc.value_counts(batch["dataset"]).to_pylist()})
    return counts


@dataclass
class Prepared:
    """A prepared table and what happened on the way."""

    rows: Any  # datasets.Dataset
    fingerprint: str
    report: SkipReport = field(default_factory=SkipReport)
    decontaminated: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # source -> rule -> n
    unreachable: dict[str, str] = field(default_factory=dict)
    heldout: Any = None  # datasets.Dataset of held-out rows (record schema + provenance); None: the source holds none
    origin: dict[str, Any] = field(default_factory=dict)  # what the rows were read from (data_source: files)
    kept: Counter = field(default_factory=Counter)  # source -> rows in `rows`: the rows that train
    capped: Counter = field(default_factory=Counter)  # source -> rows left out by `selected` (a cap per group)
    beir_sets: list[str] = field(default_factory=list)  # the BEIR sets decontaminated against (`BEIR_TEXT`)
    unseen_packages: list[str] = field(default_factory=list)  # the unseen libraries' pins, the same (`UNSEEN_TEXT`)

    def selected(self, indices: Sequence[int], why: str) -> Prepared:
        """These rows only (e.g. a cap per group, `why` saying which); the fingerprint and the counts follow."""
        rows = self.rows.select(indices)
        kept = rows_per_source(rows)
        capped = self.capped + Counter({s: n - kept[s] for s, n in self.kept.items() if n > kept[s]})
        fingerprint = fingerprint_of(self.fingerprint, "selected", why)
        return dataclasses.replace(self, rows=rows, fingerprint=fingerprint, kept=kept, capped=capped)

    def sources(self) -> list[str]:
        return sorted(set(self.report.sources()) | set(self.decontaminated) | set(self.kept))

    def rules(self) -> tuple[str, ...]:
        """The decontamination rules of this table: `RULES`, the held-out rule where rows are held out, the BEIR rule
        where the run scores BEIR sets and the unseen-library rule where it evaluates unseen libraries."""
        return (RULES + ((HELDOUT_TEXT,) if self.heldout is not None else ()) + ((BEIR_TEXT,) if self.beir_sets else ())
                + ((UNSEEN_TEXT,) if self.unseen_packages else ()))  # fmt: skip

    def decontamination(self) -> dict[str, dict[str, int]]:
        """Rows dropped per source and rule, every rule listed (0 included) for every source seen."""
        return {s: {rule: self.decontaminated.get(s, Counter())[rule] for rule in self.rules()} for s in self.sources()}

    def summary(self) -> dict[str, Any]:
        checks = self.report.as_dict()
        sources = {
            s: {"kept": self.kept[s], "passed_checks": self.report.passed[s], "capped": self.capped[s],
                "skipped": checks.get(s, {}).get("skipped", {}), "examples": checks.get(s, {}).get("examples", {})}
            for s in self.sources()
        }  # fmt: skip
        summary = {
            "fingerprint": self.fingerprint,
            "rows": len(self.rows) if self.rows is not None else 0,
            "sources": sources,
            "decontaminated": self.decontamination(),
            "unreachable": self.unreachable,
        }
        if self.heldout is not None:
            summary["heldout_rows"] = len(self.heldout)
        if self.beir_sets:
            summary["beir_sets"] = list(self.beir_sets)
        if self.unseen_packages:
            summary["unseen_packages"] = list(self.unseen_packages)
        if self.origin:
            summary["origin"] = self.origin
        if self.report.notes:
            summary["notes"] = list(self.report.notes)
        return summary

    def lines(self) -> list[str]:
        """Per source, one line from the checks to the rows that train ("CosQA: kept 8 of 10 that passed the checks;
        decontamination removed 2 (1 query is a test query, 1 ...); skipped 1 empty text"), then one indented line of
        example row ids per reason a row was skipped."""
        out = []
        for source in self.sources():
            removed = self.decontaminated.get(source, Counter())
            line = f"{source}: kept {self.kept[source]} of {self.report.passed[source]} that passed the checks"
            if sum(removed.values()):
                rules = ", ".join(f"{removed[rule]} {rule}" for rule in self.rules() if removed[rule])
                line += f"; decontamination removed {sum(removed.values())} ({rules})"
            if self.capped[source]:
                line += f"; {self.capped[source]} over the cap per group"
            skipped = self.report.skipped_counts(source)
            out += [line + (f"; {skipped}" if skipped else ""), *self.report.example_lines(source)]
        return out


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{what}: expected a text, got {type(value).__name__} {str(value)[:80]!r}")
    return value


def _task_name(task: Any) -> str:
    return getattr(getattr(task, "metadata", None), "name", type(task).__name__)


def split_keys(split: dict[str, Any], where: str) -> tuple[set[str], set[str]]:
    """(test-query keys, relevant-document keys) of one mteb 2.x retrieval split: `queries` (id, text),
    `corpus` (id, text, optional title) and `relevant_docs` ({query id: {document id: score}})."""
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
    """(keys of every test query, keys of every document a test qrel marks relevant) over the evaluated
    splits of the tasks. Task names are fetched from the hub (`mteb.get_tasks`); task objects (mteb's
    offline mock tasks, any AbsTaskRetrieval whose `load_data` fills `dataset` or the v1 attributes
    `queries`/`corpus`/`relevant_docs`) are used as given."""
    import mteb

    names = [t for t in tasks if isinstance(t, str)]
    objects = [t for t in tasks if not isinstance(t, str)] + (list(mteb.get_tasks(tasks=names)) if names else [])
    queries: set[str] = set()
    documents: set[str] = set()
    for task in objects:
        name = _task_name(task)
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


def _filtered(rows: Iterable[dict], keys: EvalKeys, counts: dict[str, Counter]) -> Iterator[dict]:
    """The clean rows, each dropped one counted by source and rule; a row's `body_key` (code runs) is compared, then
    removed: it is not a column of the table."""
    for row in rows:
        rule = keys.rule(row["query"], row["positive"], row.pop("body_key", ""))
        if rule is not None:
            counts[row["dataset"]][rule] += 1
            continue
        yield row


def _cached(cache_dir: Path | None, fingerprint: str) -> Prepared | None:
    if cache_dir is None or not (cache_dir / fingerprint / "summary.json").is_file():
        return None
    from datasets import load_from_disk

    summary = json.loads((cache_dir / fingerprint / "summary.json").read_text())
    report, kept = SkipReport(), Counter()
    for source, entry in summary["sources"].items():
        report.passed[source], kept[source] = entry["passed_checks"], entry["kept"]
        for reason, n in entry["skipped"].items():
            report.skipped[source][reason] = n
            report.examples[source, reason] = entry["examples"].get(reason, [])
    decontaminated: dict[str, Counter] = defaultdict(Counter)
    for source, by_rule in summary["decontaminated"].items():
        decontaminated[source].update({rule: n for rule, n in by_rule.items() if n})
    rows = load_from_disk(str(cache_dir / fingerprint / "rows"))
    beir_sets, unseen = summary.get("beir_sets", []), summary.get("unseen_packages", [])
    return Prepared(rows, fingerprint, report, decontaminated, summary["unreachable"], kept=kept, beir_sets=beir_sets,
                    unseen_packages=unseen)  # fmt: skip


def _store(prepared: Prepared, cache_dir: Path | None) -> Prepared:
    if cache_dir is not None:
        target = cache_dir / prepared.fingerprint
        prepared.rows.save_to_disk(str(target / "rows"))
        (target / "summary.json").write_text(json.dumps(prepared.summary(), indent=2) + "\n")
    return prepared


def _scratch_folder() -> str:
    """A fresh temporary folder for Arrow files (so that datasets' own cache never answers in place of the generator,
    which would leave the report empty), removed when the process exits: the table stays memory-mapped from it until
    then, so memory does not grow with the rows, and a run without a cache leaves nothing in the temporary directory."""
    path = tempfile.mkdtemp(prefix="c2llm-data-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _generate(generate, fingerprint: str, cache: Path | None, schema=None):
    """An Arrow table from a generator, in the cache or a scratch folder; the generator's own error (a DataError
    naming the source, a KeyboardInterrupt) surfaces as itself, not wrapped in datasets' DatasetGenerationError.
    `schema`: the table's `datasets.Features` (default: the record schema, `features()`)."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError

    cache_dir = str(cache / "arrow") if cache is not None else _scratch_folder()
    schema = features() if schema is None else schema
    try:
        return Dataset.from_generator(generate, features=schema, fingerprint=fingerprint, cache_dir=cache_dir)
    except DatasetGenerationError as err:
        if err.__cause__ is not None:
            raise err.__cause__ from None
        raise


def prepare_rows(
    rows: Callable[[RowChecker], Iterable[dict]],
    fingerprint: str,
    eval_texts: Iterable[str] = (),
    cache_dir: str | Path | None = None,
    mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
    heldout_keys: Iterable[str] = (),
    beir: BeirKeys | None = None,
    unseen: UnseenKeys | None = None,
) -> Prepared:
    """Checks, deduplicates and decontaminates the rows that `rows(checker)` yields into an Arrow table.

    `eval_texts` are offline evaluation texts (rule c), `mteb_keys` is `mteb_test_keys`' (test-query
    keys, relevant-document keys) (rules a and b), `heldout_keys` the `text_key`s of the queries and positives a
    run holds out to evaluate on, and of their functions' bodies in a code run, which a row's `body_key` is compared
    with (`HELDOUT_TEXT`), `beir` the BEIR sets the run scores (`BEIR_TEXT`), `unseen` the unseen libraries it
    evaluates (`UNSEEN_TEXT`). The table's fingerprint is
    `fingerprint` (the rows' origin and options) combined with the hash of every decontamination key, so other keys
    never read back a cached table."""

    beir = BeirKeys() if beir is None else beir
    unseen = UnseenKeys() if unseen is None else unseen
    keys = EvalKeys.of(eval_texts, mteb_keys, heldout_keys, beir.keys, unseen.keys)
    fingerprint = fingerprint_of(fingerprint, keys.fingerprint())
    cache = Path(cache_dir) if cache_dir is not None else None
    hit = _cached(cache, fingerprint)
    if hit is not None:
        return hit
    prepared = Prepared(rows=None, fingerprint=fingerprint, beir_sets=list(beir.folders),
                        unseen_packages=list(unseen.packages))  # fmt: skip
    checker = RowChecker(prepared.report)

    produced = Counter()

    def generate():
        for row in _filtered(rows(checker), keys, prepared.decontaminated):
            produced["rows"] += 1
            yield row

    try:
        table = _generate(generate, fingerprint, cache)
    except DataError:
        raise
    except ValueError:
        if produced["rows"]:
            raise
        table = None  # datasets cannot build a table from no rows; say why below
    prepared.rows = table
    if table is None or len(table) == 0:
        raise DataError(
            "no training rows are left after checks and decontamination:\n  "
            + "\n  ".join(prepared.lines() or ["(no source produced any row)"])
        )
    prepared.kept = rows_per_source(table)
    return _store(prepared, cache)


def prepare_sources(
    names: Sequence[str],
    local_root: str | Path | None = None,
    eval_texts: Iterable[str] = (),
    on_unreachable: str = "error",
    cache_dir: str | Path | None = None,
    mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
    beir: BeirKeys | None = None,
    unseen: UnseenKeys | None = None,
) -> Prepared:
    """The training rows of the named registry sources, checked and decontaminated (see `prepare_rows`)."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise DataError(f"unknown source(s) {unknown}; known: {sorted(SOURCES)}")
    if on_unreachable not in ("error", "skip"):
        raise ValueError(f"on_unreachable must be 'error' or 'skip', got {on_unreachable!r}")
    fp = fingerprint_of([asdict(SOURCES[n]) for n in names], str(local_root), on_unreachable)
    unreachable: dict[str, str] = {}

    def rows(checker: RowChecker) -> Iterator[dict]:
        for name in names:
            try:
                yield from iter_records(SOURCES[name], checker, local_root)
            except DataError as err:
                if on_unreachable == "error" or "could not load" not in str(err):
                    raise
                unreachable[name] = str(err)

    prepared = prepare_rows(rows, fp, eval_texts, cache_dir, mteb_keys, beir=beir, unseen=unseen)
    prepared.unreachable.update(unreachable)
    return prepared


def group_indices(table) -> dict[tuple[str, str], np.ndarray]:
    """Row indices of each (dataset, language) group."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, key in enumerate(zip(table["dataset"], table["language"], strict=True)):
        groups[key].append(i)
    return {k: np.asarray(v) for k, v in sorted(groups.items())}


def add_hard_negatives(
    prepared: Prepared,
    k: int = 7,
    method: str = "bm25",
    encode: Callable[..., np.ndarray] | None = None,
    shard_size: int = 50_000,
    cache_dir: str | Path | None = None,
    keep_given: bool = False,
) -> tuple[Prepared, dict[str, int]]:
    """The same rows with `negatives` mined per group; also the count of rows that got fewer than k.

    `keep_given=False` (the hub and offline sources) replaces every row's negatives with mined ones. `keep_given=True`
    (`data_source: files`) keeps a row's own negatives, at most k, without a correct answer to its query, and tops up
    a row holding fewer with mined ones (`negatives.top_up_negatives`); the report's notes count what was dropped."""

    fp = fingerprint_of(
        prepared.fingerprint, "negatives", k, method, shard_size, *(["keep_given"] if keep_given else [])
    )
    groups = group_indices(prepared.rows)
    dropped = Counter()

    def negatives_of(part) -> list[list[str]]:
        if not keep_given:
            return mine_negatives(part["query"], part["positive"], k, method, encode)
        own = own_negatives(part["query"], part["positive"], part["negatives"], k)
        dropped["answers"] += own.answers
        dropped["cut"] += own.cut
        return top_up_negatives(part["query"], part["positive"], own.kept, k, method, encode)

    def generate():
        for idx in groups.values():  # one (dataset, language) group at a time
            for start in range(0, len(idx), shard_size):
                part = prepared.rows.select(idx[start : start + shard_size])
                for row, negs in zip(part, negatives_of(part), strict=True):
                    yield {**row, "negatives": negs}

    cache = Path(cache_dir) if cache_dir is not None else None
    table = _generate(generate, fp, cache)
    report = prepared.report
    if keep_given:
        report = copy.deepcopy(report)
        report.notes.append(
            f"own negatives: {dropped['answers']} dropped as a correct answer to their query (the positive of a row "
            f"with the same query); {dropped['cut']} rows brought more than K = {k} and keep their first {k}; rows "
            f"with fewer than {k} are topped up by {method}"
        )
    short: Counter = Counter()
    for batch in table.select_columns(["dataset", "language", "negatives"]).iter(batch_size=10_000):
        for name, language, negs in zip(batch["dataset"], batch["language"], batch["negatives"], strict=True):
            if len(negs) < k:
                short[f"{name}/{language}"] += 1
    return dataclasses.replace(prepared, rows=table, fingerprint=fp, report=report), dict(
        short
    )  # same rows, same counts
