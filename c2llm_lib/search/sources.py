"""What notebook 07 searches: the folders, each indexed function (`Document`), and the known-answer queries of the run's
held-out split (docs/search.md)."""

from __future__ import annotations

import functools
import json
import os
import platform
import sysconfig
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..config import SearchStage
from ..data.offline import SNAPSHOT_DIR, TEXT_TO_CODE, load_snapshot, split_of
from ..data.records import DataError
from ..data.tree_walk import code_roots


@dataclass
class Document:
    """One indexed function: where it is, and the code the model embedded."""

    file: str  # the root's name and the path inside it, e.g. "python/json/encoder.py"
    function: str
    language: str
    start_line: int  # 1-based, decorators included
    end_line: int
    code: str  # without its documentation
    summary: str = ""  # the first paragraph of its documentation, "" when it has none (a known-answer query)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.start_line}-{self.end_line}"


@dataclass
class KnownQuery:
    """A query, and the function that answers it when that is known (a held-out pair)."""

    text: str
    file: str | None = None
    function: str | None = None
    start_line: int | None = None  # None: any function of that name in the file (the snapshot records no lines)

    @property
    def known(self) -> bool:
        return self.file is not None

    def matches(self, doc: Document) -> bool:
        return (doc.file == self.file and doc.function == self.function
                and self.start_line in (None, doc.start_line))  # fmt: skip


@dataclass
class Sources:
    """The folders to index, which of their files, and where known-answer queries come from."""

    roots: list[tuple[str, Path]]  # (name starting the file ids, folder)
    keep: Callable[[str], bool] | None  # which file ids to index; None: every file the skip rules keep
    heldout: list[KnownQuery] | None  # the run's held-out queries; None: from the indexed functions' documentation
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"root {name}: {root}" for name, root in self.roots] + self.notes


def _heldout_file(test_percent: int, file: str) -> bool:
    """Whether a file id (`root/path`) is in notebook 01's held-out split of `data_source: code`."""
    return split_of(file.split("/", 1)[1], test_percent) == "test"


def search_sources(stage: SearchStage) -> Sources:
    """The folders of `search_roots`, else the run's held-out source files."""
    if stage.search_roots:
        return Sources(code_roots(stage.search_roots), None, None, [
            "the folders named in search_roots; known-answer queries are the documentation of their functions, "
            "which may have been trained on"])  # fmt: skip
    if stage.data_source == "offline":
        return offline_sources()
    if stage.data_source == "code":
        if not stage.code_roots:
            raise DataError("search_roots is empty and data_source 'code' names no code_roots: name the folders to "
                            "search in search_roots, or the run's code_roots")  # fmt: skip
        pct = stage.code_test_percent
        note = (
            f"the held-out files of code_roots ({pct} % of the files, by a hash of each path, as notebook 01 "
            "split them); known-answer queries are their functions' documentation, notebook 01's held-out queries"
        )
        return Sources(code_roots(stage.code_roots), functools.partial(_heldout_file, pct), None, [note])
    raise DataError(f"search_roots is empty and data_source {stage.data_source!r} holds query-document pairs, not "
                    "source files: name the folders to search in search_roots")  # fmt: skip


def offline_sources(stdlib: str | os.PathLike | None = None) -> Sources:
    """The offline snapshot's held-out stdlib files and their queries; missing files named, skipped."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    rows = [r for r in load_snapshot() if r["split"] == "test" and r["dataset"] == TEXT_TO_CODE]
    python = sorted({r["file"] for r in rows if r["file"].startswith("python/")})
    present = {f for f in python if (stdlib / f.removeprefix("python/")).is_file()}
    mined = json.loads((SNAPSHOT_DIR / "manifest.json").read_text())["sources"]["python"].split(" standard")[0]
    notes = [f"{len(present)} of the offline snapshot's {len(python)} held-out Python files, read from this "
             f"Python's standard library ({platform.python_implementation()} {platform.python_version()}; the "
             f"snapshot was mined from {mined})"]  # fmt: skip
    missing = sorted(set(python) - present)
    if missing:
        notes.append(f"not in this standard library, skipped: {', '.join(missing[:5])}"
                     + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))  # fmt: skip
    other = Counter(r["file"].split("/")[1] for r in rows if not r["file"].startswith("python/"))
    notes += [f"{len({r['file'] for r in rows if r['file'].split('/')[1] == name})} held-out files of {name} not "
              f"searched: {name} is not installed here (the snapshot ships its pairs, not its files)"
              for name in sorted(other)]  # fmt: skip
    if not present:
        raise DataError(f"none of the offline snapshot's {len(python)} held-out Python files is in this Python's "
                        f"standard library ({stdlib}): name the folders to search in search_roots")  # fmt: skip
    if not os.access(stdlib, os.R_OK | os.X_OK):
        raise DataError(f"the standard library folder {stdlib} cannot be read")
    heldout = [KnownQuery(r["query"], r["file"], r["function"]) for r in rows if r["file"] in present]
    return Sources([("python", stdlib)], frozenset(present).__contains__, heldout, notes)
