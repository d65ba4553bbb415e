"""Training pairs mined with tree-sitter from a user's source trees (`data_source: code`, section 4.1's recipes), by
the library's one function miner, which search and the unseen libraries use too: docs/own-data.md#your-own-code."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

from .decontamination import NO_SETS, SetKeys
from .grammars import Function, error_line, functions, parser_for, summary_of
from .mix import Prepared, _generate, features, fingerprint_of, prepare_rows
from .offline import TEST_PERCENT, pair_records
from .records import SAME_TEXT, DataError, RowChecker, SkipReport, normalize_text, text_key
from .tree_walk import MAX_FILE_BYTES, SourceFile, code_roots, no_source, root_files, skip_summary

MIN_BODY_CHARS = 64  # a function body shorter than this (normalised) is not compared across the split
NOT_PARSED = "does not parse (skipped; first error line)"


@dataclass
class MiningReport:
    """What mining saw: per root the files mined and skipped by reason, per language the functions and records."""

    files: SkipReport = field(default_factory=SkipReport)  # source "code root <name>": passed = files parsed
    functions: Counter = field(default_factory=Counter)  # language -> function definitions found
    documented: Counter = field(default_factory=Counter)  # language -> with a documentation
    pairs: Counter = field(default_factory=Counter)  # "split/dataset/language" -> records
    digest: Any = field(default_factory=hashlib.sha256)  # of every record, in order: the mined data's identity

    def add(self, record: dict[str, Any]) -> None:
        self.pairs[f"{record['split']}/{record['dataset']}/{record['language']}"] += 1
        self.digest.update(json.dumps(record, sort_keys=True).encode())

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": self.files.as_dict(),
            "functions": dict(sorted(self.functions.items())),
            "documented": dict(sorted(self.documented.items())),
            "pairs": dict(sorted(self.pairs.items())),
        }

    def lines(self) -> list[str]:
        languages = sorted(self.functions)
        found = ", ".join(f"{lang} {self.documented[lang]}/{self.functions[lang]}" for lang in languages)
        return self.files.lines() + [f"documented/all functions: {found or 'none'}"]


def _parse(source: SourceFile, report: SkipReport) -> Any:
    """The file's tree-sitter tree, or None for a file that does not parse (counted, with its first error line)."""
    parser, _ = parser_for(source.grammar)
    tree = parser.parse(source.data)
    where = f"code root {source.root}"
    if tree.root_node.has_error:
        report.skip(where, NOT_PARSED, f"{source.file}:{error_line(tree.root_node)}")
        return None
    report.passed[where] += 1
    return tree


def every_function(source: SourceFile, report: SkipReport) -> list[Function] | None:
    """Every named function of a file, documented or not, in source order; None when the file does not parse."""
    tree = _parse(source, report)
    return None if tree is None else list(functions(tree, source.data, source.grammar, Counter(), every=True))


def body_key(body: str) -> str:
    """The `text_key` of a function's body, or "" for one under `MIN_BODY_CHARS` normalised characters."""
    return text_key(body) if len(normalize_text(body)) >= MIN_BODY_CHARS else ""


def _file_records(source: SourceFile, test_percent: int, report: MiningReport):
    rel, name, data, grammar = source.rel, source.root, source.data, source.grammar
    tree = _parse(source, report.files)
    if tree is None:
        return

    counts: Counter = Counter()
    for function in functions(tree, data, grammar, counts):
        summary = summary_of(function.doc, comment=not function.docstring)
        for row in pair_records(rel, function.name, grammar.language, summary, function.code, test_percent):
            row.update(file=f"{name}/{rel}", start_line=function.start_line, end_line=function.end_line,
                       body_key=body_key(function.body))  # fmt: skip
            report.add(row)
            yield row
    report.functions[grammar.language] += counts["functions"]
    report.documented[grammar.language] += counts["documented"]


def _root_records(name: str, root: Path, test_percent: int, report: MiningReport, max_file_bytes: int):
    pairs = sum(report.pairs.values())
    for source in root_files(name, root, report.files, max_file_bytes):
        yield from _file_records(source, test_percent, report)
    where = f"code root {name}"
    if not report.files.passed[where] and not report.files.skipped[where][NOT_PARSED]:
        raise no_source(name, root, report.files)
    skipped = skip_summary(name, report.files)
    if sum(report.pairs.values()) == pairs:
        raise DataError(f"code root {name!r} ({root}) yields no pair: no file has a function with a documentation "
                        f"long enough (3+ words) or a function of 6+ lines; skipped: {skipped}")  # fmt: skip


def mine(
    roots: Sequence[str | os.PathLike],
    test_percent: int = TEST_PERCENT,
    report: MiningReport | None = None,
    max_file_bytes: int = MAX_FILE_BYTES,
) -> Iterator[dict[str, Any]]:
    """The records of every documented function under `roots`, in sorted order; `report` gains the counts."""
    if not isinstance(test_percent, int) or isinstance(test_percent, bool) or not 0 <= test_percent <= 100:
        raise ValueError(f"test_percent must be an integer from 0 to 100, got {test_percent!r}")
    checked = code_roots(roots)
    report = MiningReport() if report is None else report
    return chain.from_iterable(
        _root_records(name, root, test_percent, report, max_file_bytes) for name, root in checked
    )


def mined_features():
    from datasets import Features, Value

    text, line = Value("string"), Value("int32")
    return Features({**features(), "split": text, "file": text, "function": text, "start_line": line, "end_line": line,
                     "body_key": text})  # fmt: skip


def _texts(table) -> Iterator[str]:
    for batch in table.select_columns(["query", "positive"]).iter(batch_size=1000):
        yield from batch["query"]
        yield from batch["positive"]


def prepare_code(
    roots: Sequence[str | os.PathLike],
    test_percent: int = TEST_PERCENT,
    eval_texts: Iterable[str] = (),
    mteb_keys: tuple[Iterable[str], Iterable[str]] = ((), ()),
    beir: SetKeys = NO_SETS,
    unseen: SetKeys = NO_SETS,
) -> Prepared:
    """The mined train split through `prepare_rows` (a held-out body is held-out text); the test split as `heldout`."""
    import numpy as np

    mining = MiningReport()
    code_roots(roots)  # a bad root fails here, not inside the Arrow writer

    walked = fingerprint_of("code", [str(r) for r in roots], test_percent)
    table = _generate(lambda: mine(roots, test_percent, mining), walked, None, mined_features())
    is_test = table.data.column("split").to_numpy(zero_copy_only=False) == "test"
    heldout, train = table.select(np.flatnonzero(is_test)), table.select(np.flatnonzero(~is_test))
    if len(heldout) == 0:
        raise DataError(f"code_roots {[str(r) for r in roots]}: no file fell in the held-out split "
                        f"({mining.files.passed.total()} files mined, {test_percent} % held out by a hash of each "
                        "path); raise code_test_percent or add files")  # fmt: skip

    same = [i for i, row in enumerate(heldout.select_columns(["query", "positive"]))
            if text_key(row["query"]) == text_key(row["positive"])]  # fmt: skip
    skipped, heldout = heldout.select(same), heldout.select(sorted(set(range(len(heldout))) - set(same)))
    bodies = set(heldout["body_key"]) - {""}
    heldout = heldout.remove_columns("body_key")

    def rows(checker: RowChecker) -> Iterator[dict]:
        checker.report.update(mining.files)  # the files mined and skipped, beside the rows (and in any error)
        for row in skipped:
            checker.report.skip(row["dataset"], f"{SAME_TEXT} (held out)", _row_id(row))
        for batch in train.iter(batch_size=1000):
            for i, dataset in enumerate(batch["dataset"]):
                row_id = _row_id({key: batch[key][i] for key in ("file", "start_line", "function")})
                record = checker.record(dataset, row_id, batch["query"][i], batch["positive"][i],
                                        batch["language"][i], batch["instruction"][i])  # fmt: skip
                if record is not None:
                    yield {**record, "body_key": batch["body_key"][i]}  # compared with the held-out bodies

    fingerprint = fingerprint_of("code", mining.digest.hexdigest(), test_percent)
    heldout_keys = chain(map(text_key, _texts(heldout)), bodies)
    prepared = prepare_rows(rows, fingerprint, eval_texts, mteb_keys=mteb_keys, heldout_keys=heldout_keys, beir=beir,
                            unseen=unseen)  # fmt: skip
    prepared.heldout = heldout
    return prepared


def _row_id(row: dict[str, Any]) -> str:
    return f"{row['file']}:{row['start_line']} {row['function']}"
