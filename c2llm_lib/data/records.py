"""The unified training record (`dataset, language, query, positive, negatives, instruction`, section 4.1) and the
checks every source goes through: a bad row is a counted skip (`SkipReport`), an unusable source a `DataError`."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..entries import LANGUAGES

RECORD_COLUMNS = ("dataset", "language", "query", "positive", "negatives", "instruction")
_SPACE = re.compile(r"\s+")
# A pair whose query is its positive teaches nothing, and held out it is found by every model, BM25 included (nDCG
# 100): the row is skipped and counted with its id (file and row), not refused, since one such row should not stop a
# run over a user's file or a hub source that cannot be edited, and the report says where it is.
SAME_TEXT = "query equals its positive"


class DataError(ValueError):
    """A source or row that cannot be used; the message names the source, and the row or column."""


def normalize_text(text: str) -> str:
    """NFC, whitespace runs collapsed to one space, stripped: equal under formatting-only changes."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def text_key(text: str) -> str:
    """A 128-bit hash of the normalised text, used for deduplication and decontamination."""
    return hashlib.blake2b(normalize_text(text).encode("utf-8"), digest_size=16).hexdigest()


def as_text(value: Any) -> str | None:
    """The value as valid UTF-8 text, or None if it is not text or is not valid UTF-8."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")  # lone surrogates from a bad decode fail here
    except UnicodeEncodeError:
        return None
    return value


@dataclass
class SkipReport:
    """Rows that passed the checks, rows skipped per source with reasons and examples, and notes on defaults."""

    passed: Counter = field(default_factory=Counter)  # rows that passed the checks (before decontamination)
    skipped: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    examples: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    notes: list[str] = field(default_factory=list)

    def skip(self, source: str, reason: str, row_id: str) -> None:
        self.skipped[source][reason] += 1
        if len(self.examples[source, reason]) < 5:
            self.examples[source, reason].append(row_id)

    def update(self, other: SkipReport) -> None:
        """Adds another report's counts, examples (up to 5 per source and reason) and notes."""
        self.passed.update(other.passed)
        for source, reasons in other.skipped.items():
            self.skipped[source].update(reasons)
            for reason in reasons:
                examples = self.examples[source, reason]
                examples += other.examples[source, reason][: 5 - len(examples)]
        self.notes += [note for note in other.notes if note not in self.notes]

    def sources(self) -> list[str]:
        return sorted(set(self.passed) | set(self.skipped))

    def as_dict(self) -> dict[str, Any]:
        return {
            s: {
                "passed_checks": self.passed[s],
                "skipped": dict(self.skipped[s]),
                "examples": {r: self.examples[s, r] for r in self.skipped[s]},
            }
            for s in self.sources()
        }

    def skipped_counts(self, source: str) -> str:
        """ "skipped 1 empty text, 1 duplicate row" (most frequent reason first), or "" when none was skipped."""
        counts = ", ".join(f"{n} {reason}" for reason, n in self.skipped[source].most_common())
        return f"skipped {counts}" if counts else ""

    def example_lines(self, source: str) -> list[str]:
        """One indented line of example row ids per reason, most frequent reason first."""
        return [f"  {r}, e.g. {'; '.join(self.examples[source, r])}" for r, _ in self.skipped[source].most_common()]

    def lines(self) -> list[str]:
        """Per source, one line of counts, then one indented line of example row ids per reason; then the notes."""
        out = []
        for source in self.sources():
            skipped = self.skipped_counts(source)
            out.append(f"{source}: passed checks {self.passed[source]}" + (f"; {skipped}" if skipped else ""))
            out += self.example_lines(source)
        return out + [f"note: {note}" for note in self.notes]


class RowChecker:
    """Turns raw (query, positive, language) values into records or counted skips, per source."""

    def __init__(self, report: SkipReport) -> None:
        self.report = report
        self._seen: dict[str, set[str]] = defaultdict(set)

    def record(
        self,
        source: str,
        row_id: str,
        query: Any,
        positive: Any,
        language: Any,
        instruction: str,
        negatives: list[str] | None = None,
    ) -> dict[str, Any] | None:
        q, p = as_text(query), as_text(positive)
        if q is None or p is None:
            self.report.skip(source, "non-text or non-UTF-8 text", row_id)
            return None
        if not q.strip() or not p.strip():
            self.report.skip(source, "empty text", row_id)
            return None
        lang = str(language).strip().lower() if language is not None else ""
        if lang not in LANGUAGES:
            self.report.skip(source, f"unknown language {lang!r}", row_id)
            return None
        q_key, p_key = text_key(q), text_key(p)
        if q_key == p_key:
            self.report.skip(source, SAME_TEXT, row_id)
            return None
        if q_key + p_key in self._seen[source]:
            self.report.skip(source, "duplicate row", row_id)
            return None
        self._seen[source].add(q_key + p_key)
        self.report.passed[source] += 1
        return {
            "dataset": source,
            "language": lang,
            "query": q,
            "positive": p,
            "negatives": list(negatives or []),
            "instruction": instruction,
        }


def require_columns(source: str, table: str, columns: list[str], needed: tuple[str, ...]) -> None:
    missing = [c for c in needed if c not in columns]
    if missing:
        raise DataError(f"source {source}: {table} has no column {missing} (columns: {sorted(columns)})")
