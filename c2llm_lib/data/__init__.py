"""Training data (paper section 4.1): sources, records, decontamination, negatives, the offline set, own files."""

from .mix import Prepared, add_hard_negatives, prepare_rows, prepare_sources
from .negatives import mine_negatives
from .records import RECORD_COLUMNS, DataError, RowChecker, SkipReport, text_key
from .sources import SOURCES, TABLE_1, Source, iter_records

__all__ = [
    "RECORD_COLUMNS", "SOURCES", "TABLE_1", "DataError", "Prepared", "RowChecker", "SkipReport", "Source",
    "add_hard_negatives", "iter_records", "mine_negatives", "prepare_rows", "prepare_sources", "text_key",
]  # fmt: skip
