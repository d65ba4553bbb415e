"""Training pairs a user already has (`data_source: files`, section 4.1), read through `datasets` from a fresh
scratch folder each, a stable share of the queries held out, the rest decontaminated (docs/own-data.md)."""

from __future__ import annotations

import dataclasses
import glob
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..entries import FileEntry
from ..files import file_digest
from .decontamination import NO_SETS, EvalKeys, SetKeys
from .layouts import DEFAULT_LANGUAGE, BadRow, FileDefaults, Layout, PairRow, detect_layout, read_rows
from .mix import Prepared, _generate, _scratch_folder, features, fingerprint_of, prepare_rows
from .records import DataError, RowChecker, SkipReport, text_key
from .sources import _parse_line

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"  # where the notebooks run: relative paths start here
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


@dataclass(frozen=True)
class DataFile:
    """One file (or save_to_disk folder) to read, resolved from its entry."""

    entry: FileEntry
    index: int  # the entry's position in data_files
    path: Path
    label: str  # the path as the user wrote it (a folder's files: joined to the folder's entry)
    format: str  # json, csv, parquet or disk
    group: str | None  # None: by entry.group_column

    @property
    def shown(self) -> str:
        """The file as named in errors: as the user wrote it, with where that is if it differs."""
        return self.label if self.label == str(self.path) else f"{self.label} ({self.path})"


def _is_save_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _resolved(entry: FileEntry, index: int, base_dir: Path) -> Path:
    given = Path(entry.path).expanduser()
    path = Path(os.path.abspath(given if given.is_absolute() else base_dir / given))  # "a/../b" as "b"
    if not path.exists():
        relative = "" if given.is_absolute() else f"; relative paths are resolved from {base_dir}, where notebooks run"
        raise DataError(f"data_files entry {index}: {entry.path!r} does not exist (looked for {path}{relative})")
    return path


def _entry_files(entry: FileEntry, index: int, base_dir: Path, notes: list[str]) -> list[tuple[Path, str, str]]:
    path = _resolved(entry, index, base_dir)
    if path.is_dir() and _is_save_to_disk(path):
        return [(path, entry.path, "disk")]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if not p.name.startswith("."))
        data = [p for p in found if p.is_file() and p.suffix.lower() in FORMATS]
        if not data:
            raise DataError(
                f"data_files entry {index}: the folder {entry.path!r} ({path}) holds no data file "
                f"({', '.join(FORMATS)}) and is not a datasets.save_to_disk folder; it holds "
                f"{[p.name for p in found][:10]}"
            )
        ignored = [p.name for p in found if p not in data]
        if ignored:
            notes.append(f"the folder {entry.path} is read file by file; ignored (not {', '.join(FORMATS)}): {ignored}")
        return [(p, f"{entry.path.rstrip('/')}/{p.name}", FORMATS[p.suffix.lower()]) for p in data]
    if path.suffix.lower() not in FORMATS:
        raise DataError(
            f"data_files entry {index}: {entry.path!r} is not a {', '.join(FORMATS)} file, a folder of them, "
            "or a datasets.save_to_disk folder"
        )
    return [(path, entry.path, FORMATS[path.suffix.lower()])]


def resolve_files(entries: Sequence[FileEntry], base_dir: Path = NOTEBOOK_DIR) -> tuple[list[DataFile], list[str]]:
    """Every file the entries name, with its group, and notes on the choices made; a file reached twice is an error."""
    notes: list[str] = []
    found = [(i, e, *f) for i, e in enumerate(entries) for f in _entry_files(e, i, base_dir, notes)]
    first: dict[Path, int] = {}
    for i, _, path, label, _ in found:
        if path.resolve() in first:
            raise DataError(
                f"data_files entries {first[path.resolve()]} and {i} both read {label} ({path.resolve()}): "
                "its rows would count twice; name each file once"
            )
        first[path.resolve()] = i
    taken = {e.group for e in entries if e.group is not None}
    stems: dict[str, str] = {}  # group name -> the file it was named after
    files = []
    for i, entry, path, label, fmt in found:
        group = entry.group
        if group is None and entry.group_column is None:
            group = _stem_group(path, label, taken, stems, notes)
        files.append(DataFile(entry, i, path, label, fmt, group))
    return files, notes


def _stem_group(path: Path, label: str, taken: set[str], stems: dict[str, str], notes: list[str]) -> str:
    stem = path.name if path.is_dir() else path.stem
    name, n = stem, 1
    while name in taken or name in stems:
        n += 1
        name = f"{stem}-{n}"
    if name != stem:
        other = stems.get(stem, "a `group` entry")
        notes.append(f"{label} is group {name!r}: {stem!r} is already {other}'s group (set `group` to name it)")
    stems[name] = label
    return name


def _first_bad_line(path: Path) -> str:
    """Where a JSON-lines file first stops being JSON lines ("line 3: line with malformed JSON ..."), or ""."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                row, reason, detail = _parse_line(raw.removeprefix(b"\xef\xbb\xbf") if number == 1 else raw)
                if row is None:
                    return f" (line {number}: {reason}{detail})"
    return ""


def _csv_options(file: DataFile) -> dict[str, Any]:
    """Every cell a text (datasets' csv builder would read "404" as a number and "NA" or "None" as missing)."""
    import csv

    from datasets import Features, Value

    with file.path.open(newline="", encoding="utf-8-sig") as handle:
        header = next(csv.reader(handle), [])
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise DataError(f"data file {file.label}: its header repeats the column(s) {repeated}")
    return {
        "features": Features({name: Value("string") for name in header}),
        "keep_default_na": False,
        "na_filter": False,
        "index_col": False,
        "on_bad_lines": "error",
    }


def _unreadable(file: DataFile, err: BaseException) -> DataError:
    cause = err.__cause__ or err
    if "corresponds to no data" in str(err):
        return DataError(f"data file {file.shown} holds no rows")
    where = _first_bad_line(file.path) if file.path.suffix.lower() == ".jsonl" else ""
    return DataError(f"data file {file.shown} cannot be read as {file.format}{where}: {type(cause).__name__}: {cause}")


def load_table(file: DataFile):
    """The file as a `datasets.Dataset` made in a fresh scratch folder, or a `save_to_disk` folder memory-mapped."""
    import datasets
    import pandas as pd

    if file.format == "disk":
        return _load_saved(file)
    if file.path.stat().st_size == 0:
        raise DataError(f"data file {file.shown} is empty")
    try:
        options = _csv_options(file) if file.format == "csv" else {}
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)  # a CSV line with too many fields loses data
            table = datasets.load_dataset(file.format, data_files=[glob.escape(str(file.path))], split="train",
                                          cache_dir=_scratch_folder(), **options)  # fmt: skip
    except DataError:
        raise
    except (Exception, StopIteration) as err:  # datasets raises StopIteration on an empty JSON file
        raise _unreadable(file, err) from None
    if len(table) == 0:
        raise DataError(f"data file {file.shown} holds no rows")
    return table


def _load_saved(file: DataFile):
    import datasets

    try:
        table = datasets.load_from_disk(str(file.path))
    except Exception as err:
        raise DataError(f"{file.shown} cannot be read as a datasets.save_to_disk folder: {err}") from None
    if isinstance(table, datasets.DatasetDict):
        splits = list(table)
        if len(splits) != 1 and "train" not in splits:
            raise DataError(f"{file.label} is a DatasetDict with splits {splits}: save one split, or one named train")
        table = table["train" if "train" in splits else splits[0]]
    if len(table) == 0:
        raise DataError(f"{file.shown} holds no rows")
    return table


@dataclass
class FileStats:
    """What one file gave: rows read, skipped and held out, records kept, and where instructions came from."""

    rows: int = 0
    skipped: int = 0
    heldout_rows: int = 0
    records: int = 0  # training records kept (before decontamination)
    heldout_records: int = 0
    evaluated_negatives: int = 0  # own negatives dropped as an evaluated text
    instruction: Counter = field(default_factory=Counter)  # row / entry / default
    language: Counter = field(default_factory=Counter)


@dataclass
class OpenFile:
    file: DataFile
    table: Any  # datasets.Dataset
    layout: Layout
    digest: str
    stats: FileStats = field(default_factory=FileStats)

    def rows(self, default_instruction: str) -> Iterator[PairRow | BadRow]:
        """Every row, read in order (`layouts.read_rows`); a file with no usable row is an error listing why."""
        entry = self.file.entry
        defaults = FileDefaults(
            self.file.label, self.file.group,
            entry.instruction or default_instruction, "entry" if entry.instruction else "default",
            entry.language or DEFAULT_LANGUAGE, "entry" if entry.language else "default",
        )  # fmt: skip
        return read_rows(self.table, self.layout, defaults)


def open_files(files: Sequence[DataFile]) -> list[OpenFile]:
    opened = []
    for file in files:
        table = load_table(file)
        layout = detect_layout(file.label, table.column_names, file.entry.group_column, file.index)
        opened.append(OpenFile(file, table, layout, file_digest(file.path)))
    return opened


def is_heldout(query: str, fraction: float) -> bool:
    """Whether a query's rows are held out: its normalised text's hash lies in the first `fraction` of the range."""
    return fraction > 0 and int(text_key(query)[:15], 16) < fraction * 16**15


def heldout_features():
    from datasets import Features, Value

    return Features({**features(), "file": Value("string"), "row": Value("int64")})


def _heldout(opened: list[OpenFile], instruction: str, fraction: float, fingerprint: str):
    """(held-out Dataset or None, the keys of its queries and positives, the held-out rows' skip report)."""
    if fraction == 0:
        return None, frozenset(), SkipReport()
    report, keys = SkipReport(), set()
    checker = RowChecker(report)

    def generate():
        for item in opened:
            for row in item.rows(instruction):
                if isinstance(row, PairRow) and is_heldout(row.query, fraction):
                    for record in _records(checker, row):
                        item.stats.heldout_records += 1
                        keys.update((text_key(record["query"]), text_key(record["positive"])))
                        yield {**record, "file": str(item.file.path), "row": row.index}

    table = _generate(generate, fingerprint_of(fingerprint, "heldout"), None, heldout_features())
    return table, frozenset(keys), report


def _records(checker: RowChecker, row: PairRow) -> Iterator[dict]:
    for j, positive in enumerate(row.positives):
        row_id = row.row_id + (f" positive {j}" if len(row.positives) > 1 else "")
        record = checker.record(row.group, row_id, row.query, positive, row.language, row.instruction, row.negatives)
        if record is not None:
            yield record


def prepare_files(
    entries: Sequence[FileEntry],
    default_instruction: str,
    heldout_fraction: float = 0.2,
    eval_texts: Sequence[str] = (),
    mteb_keys: tuple[Sequence[str], Sequence[str]] = ((), ()),
    base_dir: Path = NOTEBOOK_DIR,
    beir: SetKeys = NO_SETS,
    unseen: SetKeys = NO_SETS,
) -> Prepared:
    """A user's files as checked, decontaminated training rows (`mix.prepare_rows`); held out: `Prepared.heldout`."""
    if not entries:
        raise DataError("data_source 'files' needs at least one data_files entry")
    if not 0 <= heldout_fraction < 1:
        raise DataError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    files, notes = resolve_files(entries, base_dir)
    opened = open_files(files)
    fingerprint = fingerprint_of("files", [[f.file.label, str(f.file.path), f.file.format, f.digest,
                                            asdict(f.file.entry), f.file.group] for f in opened],
                                 default_instruction, heldout_fraction)  # fmt: skip
    heldout, heldout_keys, heldout_report = _heldout(opened, default_instruction, heldout_fraction, fingerprint)

    evaluated = EvalKeys.of(eval_texts, mteb_keys, heldout_keys, beir.keys, unseen.keys)

    def rows(checker: RowChecker) -> Iterator[dict]:
        for item in opened:
            yield from _training_rows(item, checker, default_instruction, heldout_fraction, evaluated)

    try:
        prepared = prepare_rows(rows, fingerprint, eval_texts, None, mteb_keys, heldout_keys, beir, unseen)
    except DataError as err:
        if heldout is None or not len(heldout):
            raise
        raise DataError(
            f"{err}\n  ({len(heldout)} rows are held out: files_heldout_fraction {heldout_fraction})"
        ) from None
    _merge_skips(prepared.report, heldout_report)
    prepared.heldout = heldout
    prepared.origin = _origin(opened, default_instruction, heldout_fraction)
    prepared.report.notes += notes + _notes(opened, default_instruction, heldout_fraction, heldout)
    return prepared


def _training_rows(
    item: OpenFile, checker: RowChecker, instruction: str, fraction: float, evaluated: EvalKeys
) -> Iterator[dict]:
    """The file's training records; an own negative that is an evaluated text is dropped and counted."""
    stats = item.stats
    for row in item.rows(instruction):
        stats.rows += 1
        if isinstance(row, BadRow):
            stats.skipped += 1
            checker.report.skip(row.source, row.reason, row.row_id)
            continue
        stats.instruction[row.instruction_from] += 1
        stats.language[row.language_from] += 1
        if is_heldout(row.query, fraction):
            stats.heldout_rows += 1
            continue
        clean = [n for n in row.negatives if evaluated.rule(n, n) is None]  # n is no evaluated text of any rule
        stats.evaluated_negatives += len(row.negatives) - len(clean)
        for record in _records(checker, dataclasses.replace(row, negatives=clean)):
            stats.records += 1
            yield record


def _merge_skips(report: SkipReport, other: SkipReport) -> None:
    for source, reasons in other.skipped.items():
        for reason, n in reasons.items():
            marked = f"{reason} (held out)"
            report.skipped[source][marked] += n
            report.examples[source, marked] = (report.examples[source, marked] + other.examples[source, reason])[:5]


def _origin(opened: list[OpenFile], instruction: str, fraction: float) -> dict[str, Any]:
    return {
        "data_source": "files",
        "default_instruction": instruction,
        "default_language": DEFAULT_LANGUAGE,
        "heldout_fraction": fraction,
        "files": [
            {
                "entry": f.file.index, "given": f.file.label, "path": str(f.file.path), "format": f.file.format,
                "sha256": f.digest, "layout": f.layout.name,
                "group": f.file.group if f.file.group is not None else {"column": f.file.entry.group_column},
                "rows": f.stats.rows, "skipped": f.stats.skipped, "heldout_rows": f.stats.heldout_rows,
                "records": f.stats.records, "heldout_records": f.stats.heldout_records,
                "evaluated_negatives_dropped": f.stats.evaluated_negatives,
                "instruction_from": dict(f.stats.instruction), "language_from": dict(f.stats.language),
                "ignored_columns": sorted(set(f.table.column_names) - set(f.layout.columns)),
            }
            for f in opened
        ],
    }  # fmt: skip


def _notes(opened: list[OpenFile], instruction: str, fraction: float, heldout: Any) -> list[str]:
    counts = sum((f.stats.instruction for f in opened), Counter())
    languages = sum((f.stats.language for f in opened), Counter())
    notes = [
        f"instruction: {counts['row']} rows give their own (prompt or instruction column), {counts['entry']} take "
        f"their data_files entry's, {counts['default']} the run's files_instruction {instruction!r}"
    ]
    evaluated = sum(f.stats.evaluated_negatives for f in opened)
    if evaluated:
        notes.append(f"own negatives: {evaluated} dropped as an evaluated text (held out, offline, MTEB test or BEIR "
                     "set)")  # fmt: skip
    if languages["default"]:
        notes.append(f"language: {languages['default']} rows name none (no language column or entry key): "
                     f"{DEFAULT_LANGUAGE!r}")  # fmt: skip
    for f in opened:
        ignored = sorted(set(f.table.column_names) - set(f.layout.columns))
        if ignored:
            notes.append(f"{f.file.label} ({f.layout.name} layout): ignored columns {ignored}")
    if heldout is None:
        notes.append("held out: none (files_heldout_fraction is 0)")
    else:
        rows = sum(f.stats.heldout_rows for f in opened)
        notes.append(
            f"held out for evaluation: {rows} rows ({len(heldout)} records), files_heldout_fraction {fraction} of the "
            "queries by a hash of their normalised text; the training rows are decontaminated against their texts"
        )
    return notes
