"""The training mix at scale (section 4.1): rows stream through the checks and decontamination into Arrow on disk,
negatives are mined per group in bounded shards, and the mix is cached under `cache_dir/<fingerprint>/`."""

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

from ..files import scratch_folder
from .decontamination import BEIR_TEXT, HELDOUT_TEXT, NO_SETS, RULES, UNSEEN_TEXT, EvalKeys, SetKeys, clean_rows
from .negatives import mine_negatives, own_negatives, top_up_negatives
from .records import RECORD_COLUMNS, DataError, RowChecker, SkipReport
from .sources import SOURCES, iter_records

# 2: decontamination by rule (test queries, relevant documents, offline); 3: both directions; 4: a pair whose query
# equals its positive is skipped, held-out function bodies and BEIR sets are decontaminated against
DATA_FORMAT_VERSION = 4


def features():
    """The record's Arrow schema: `RECORD_COLUMNS` in order, each a text but `negatives`, a list of texts."""
    from datasets import Features, List, Value

    text = Value("string")
    return Features({name: List(text) if name == "negatives" else text for name in RECORD_COLUMNS})


def fingerprint_of(*parts: Any) -> str:
    blob = json.dumps([DATA_FORMAT_VERSION, *parts], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def rows_per_source(table) -> Counter:
    """Rows of each source (the `dataset` column) of a table, counted in Arrow batches (no text is read)."""
    import pyarrow.compute as pc

    counts: Counter = Counter()
    for batch in table.select_columns(["dataset"]).with_format("arrow").iter(batch_size=65_536):
        counts.update({e["values"]: e["counts"] for e in pc.value_counts(batch["dataset"]).to_pylist()})
    return counts


@dataclass
class Prepared:
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
        """This table's decontamination rules: `RULES`, plus the held-out, BEIR and unseen rules where they apply."""
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
        """Per source, one line from the checks to the rows that train, then a line of example row ids per reason."""
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
    """A fresh temporary folder for Arrow files, removed at exit (or, after a killed process, by the next that makes
    one), so datasets' cache never answers for a generator."""
    path = str(scratch_folder(tempfile.gettempdir(), "c2llm-data-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _generate(generate: Callable[[], Iterable[dict]], fingerprint: str, cache: Path | None, schema=None):
    """An Arrow table of the rows `generate()` yields (`schema`: default the records'), empty when it yields none; its
    own errors surface unwrapped."""
    from datasets import Dataset
    from datasets.exceptions import DatasetGenerationError

    cache_dir = str(cache / "arrow") if cache is not None else _scratch_folder()
    schema = features() if schema is None else schema
    produced = Counter()

    def counted() -> Iterator[dict]:
        for row in generate():
            produced["rows"] += 1
            yield row

    try:
        return Dataset.from_generator(counted, features=schema, fingerprint=fingerprint, cache_dir=cache_dir)
    except DatasetGenerationError as err:
        if err.__cause__ is not None:
            raise err.__cause__ from None
        raise
    except ValueError:
        if produced["rows"]:
            raise
        # datasets builds no table from no rows: an empty one with the schema
        return Dataset.from_dict({name: [] for name in schema}, features=schema)


def prepare_rows(
    rows: Callable[[RowChecker], Iterable[dict]],
    fingerprint: str,
    eval_texts: Iterable[str] = (),
    cache_dir: str | Path | None = None,
    mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
    heldout_keys: Iterable[str] = (),
    beir: SetKeys = NO_SETS,
    unseen: SetKeys = NO_SETS,
) -> Prepared:
    """Checks, deduplicates and decontaminates `rows(checker)` into an Arrow table whose fingerprint holds every key."""

    keys = EvalKeys.of(eval_texts, mteb_keys, heldout_keys, beir.keys, unseen.keys)
    fingerprint = fingerprint_of(fingerprint, keys.fingerprint())
    cache = Path(cache_dir) if cache_dir is not None else None
    hit = _cached(cache, fingerprint)
    if hit is not None:
        return hit
    prepared = Prepared(rows=None, fingerprint=fingerprint, beir_sets=list(beir.names),
                        unseen_packages=list(unseen.names))  # fmt: skip
    checker = RowChecker(prepared.report)
    prepared.rows = _generate(lambda: clean_rows(rows(checker), keys, prepared.decontaminated), fingerprint, cache)
    if len(prepared.rows) == 0:
        raise DataError(
            "no training rows are left after checks and decontamination:\n  "
            + "\n  ".join(prepared.lines() or ["(no source produced any row)"])
        )
    prepared.kept = rows_per_source(prepared.rows)
    return _store(prepared, cache)


def prepare_sources(
    names: Sequence[str],
    local_root: str | Path | None = None,
    eval_texts: Iterable[str] = (),
    on_unreachable: str = "error",
    cache_dir: str | Path | None = None,
    mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
    beir: SetKeys = NO_SETS,
    unseen: SetKeys = NO_SETS,
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
    """The rows with `negatives` mined per group, and the count of rows short of k; `keep_given` tops up own ones."""

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
    mined = dataclasses.replace(prepared, rows=table, fingerprint=fp, report=report)  # same rows, same counts
    return mined, dict(short)
