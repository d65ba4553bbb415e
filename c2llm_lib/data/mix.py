"""Preparing the training mix at scale: streaming, decontamination, hard negatives, caching (section 4.1).

Rows stream from each source through the record checks (`RowChecker`) and the decontamination
filter straight into an Arrow table on disk (`datasets.Dataset.from_generator`), so memory does not
grow with the number of rows beyond a few small hash sets and id indexes. Negatives are mined one
(dataset, language) group at a time, in shards of at most `shard_size` rows, so memory stays bounded
by the shard, not the mix.

Decontamination drops a training row whose query or positive, after normalisation
(`records.text_key`), equals any evaluation query or document: every MTEB(Code, v1) test query and
corpus document where the hub is reachable (`mteb_test_texts`), and always the offline evaluation
sets. Counts are reported per source.

A prepared mix is cached under `cache_dir/<fingerprint>/` (the Arrow table and its report), where
the fingerprint hashes the sources, their revisions, every option and the data format version; the
same request is read back instead of being rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .negatives import mine_negatives
from .records import DataError, RowChecker, SkipReport, text_key
from .sources import SOURCES, iter_records

DATA_FORMAT_VERSION = 1
MTEB_CODE_TASKS = (
    "AppsRetrieval", "CodeEditSearchRetrieval", "CodeFeedbackMT", "CodeFeedbackST", "CodeSearchNetCCRetrieval",
    "CodeSearchNetRetrieval", "CodeTransOceanContest", "CodeTransOceanDL", "COIRCodeSearchNetRetrieval", "CosQA",
    "StackOverflowQA", "SyntheticText2SQL",
)  # fmt: skip


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


@dataclass
class Prepared:
    """A prepared table and what happened on the way."""

    rows: Any  # datasets.Dataset
    fingerprint: str
    report: SkipReport = field(default_factory=SkipReport)
    decontaminated: Counter = field(default_factory=Counter)
    unreachable: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "rows": len(self.rows),
            "sources": self.report.as_dict(),
            "decontaminated": dict(self.decontaminated),
            "unreachable": self.unreachable,
        }


def mteb_test_texts(tasks: Sequence[Any] = MTEB_CODE_TASKS) -> Iterator[str]:
    """Every query and corpus document of the tasks' evaluation splits (task names need the hub; task
    objects, such as mteb's offline mock tasks, are used as given)."""
    import mteb

    names = [t for t in tasks if isinstance(t, str)]
    objects = [t for t in tasks if not isinstance(t, str)] + (list(mteb.get_tasks(tasks=names)) if names else [])
    for task in objects:
        try:
            task.load_data()
        except Exception as err:
            raise DataError(f"MTEB task {task.metadata.name}: could not load its test data ({err})") from err
        for subset in task.dataset.values():
            for split in task.metadata.eval_splits:
                if split in subset:
                    yield from subset[split]["queries"]["text"]
                    yield from subset[split]["corpus"]["text"]


def _filtered(rows: Iterable[dict], keys: set[str], counts: Counter) -> Iterator[dict]:
    for row in rows:
        if keys and (text_key(row["query"]) in keys or text_key(row["positive"]) in keys):
            counts[row["dataset"]] += 1
            continue
        yield row


def _cached(cache_dir: Path | None, fingerprint: str) -> Prepared | None:
    if cache_dir is None or not (cache_dir / fingerprint / "summary.json").is_file():
        return None
    from datasets import load_from_disk

    summary = json.loads((cache_dir / fingerprint / "summary.json").read_text())
    report = SkipReport()
    for source, entry in summary["sources"].items():
        report.kept[source] = entry["kept"]
        for reason, n in entry["skipped"].items():
            report.skipped[source][reason] = n
            report.examples[source, reason] = entry["examples"].get(reason, [])
    return Prepared(
        load_from_disk(str(cache_dir / fingerprint / "rows")),
        fingerprint,
        report,
        Counter(summary["decontaminated"]),
        summary["unreachable"],
    )


def _store(prepared: Prepared, cache_dir: Path | None) -> Prepared:
    if cache_dir is not None:
        target = cache_dir / prepared.fingerprint
        prepared.rows.save_to_disk(str(target / "rows"))
        (target / "summary.json").write_text(json.dumps(prepared.summary(), indent=2) + "\n")
    return prepared


def _arrow_dir(cache: Path | None) -> str:
    """Where Arrow files go: the cache, or a fresh folder (so that datasets' own cache never answers in
    place of the generator, which would leave the report empty)."""
    return str(cache / "arrow") if cache is not None else tempfile.mkdtemp(prefix="c2llm-data-")


def _generate(generate, fingerprint: str, cache: Path | None):
    """An Arrow table from a generator; the generator's own error (a DataError naming the source, a
    KeyboardInterrupt) surfaces as itself, not wrapped in datasets' DatasetGenerationError."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError

    try:
        return Dataset.from_generator(
            generate, features=features(), fingerprint=fingerprint, cache_dir=_arrow_dir(cache)
        )
    except DatasetGenerationError as err:
        if err.__cause__ is not None:
            raise err.__cause__ from None
        raise


def prepare_rows(
    rows: Callable[[RowChecker], Iterable[dict]],
    fingerprint: str,
    eval_texts: Iterable[str] = (),
    cache_dir: str | Path | None = None,
) -> Prepared:
    """Checks, deduplicates and decontaminates the rows that `rows(checker)` yields into an Arrow table."""

    cache = Path(cache_dir) if cache_dir is not None else None
    hit = _cached(cache, fingerprint)
    if hit is not None:
        return hit
    keys = {text_key(t) for t in eval_texts}
    prepared = Prepared(rows=None, fingerprint=fingerprint)
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
            + "\n  ".join(prepared.report.lines() or ["(no source produced any row)"])
        )
    return _store(prepared, cache)


def prepare_sources(
    names: Sequence[str],
    local_root: str | Path | None = None,
    eval_texts: Iterable[str] = (),
    on_unreachable: str = "error",
    cache_dir: str | Path | None = None,
) -> Prepared:
    """The training rows of the named registry sources, checked and decontaminated."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise DataError(f"unknown source(s) {unknown}; known: {sorted(SOURCES)}")
    if on_unreachable not in ("error", "skip"):
        raise ValueError(f"on_unreachable must be 'error' or 'skip', got {on_unreachable!r}")
    eval_texts = list(eval_texts)
    fp = fingerprint_of(
        [asdict(SOURCES[n]) for n in names],
        str(local_root),
        on_unreachable,
        hashlib.sha256("\n".join(sorted(eval_texts)).encode()).hexdigest(),
    )
    unreachable: dict[str, str] = {}

    def rows(checker: RowChecker) -> Iterator[dict]:
        for name in names:
            try:
                yield from iter_records(SOURCES[name], checker, local_root)
            except DataError as err:
                if on_unreachable == "error" or "could not load" not in str(err):
                    raise
                unreachable[name] = str(err)

    prepared = prepare_rows(rows, fp, eval_texts, cache_dir)
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
) -> tuple[Prepared, dict[str, int]]:
    """The same rows with `negatives` mined per group; also the count of rows that got fewer than k."""

    fp = fingerprint_of(prepared.fingerprint, "negatives", k, method, shard_size)
    groups = group_indices(prepared.rows)

    def generate():
        for idx in groups.values():  # one (dataset, language) group at a time
            for start in range(0, len(idx), shard_size):
                part = prepared.rows.select(idx[start : start + shard_size])
                negatives = mine_negatives(part["query"], part["positive"], k, method, encode)
                for row, negs in zip(part, negatives, strict=True):
                    yield {**row, "negatives": negs}

    cache = Path(cache_dir) if cache_dir is not None else None
    table = _generate(generate, fp, cache)
    short: Counter = Counter()
    for batch in table.select_columns(["dataset", "language", "negatives"]).iter(batch_size=10_000):
        for name, language, negs in zip(batch["dataset"], batch["language"], batch["negatives"], strict=True):
            if len(negs) < k:
                short[f"{name}/{language}"] += 1
    return Prepared(table, fp, prepared.report, prepared.decontaminated, prepared.unreachable), dict(short)
