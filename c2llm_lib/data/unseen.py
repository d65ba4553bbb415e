"""Evaluation sets mined from pinned Python libraries no training row came from (section 4.2 on unseen code), and
their keys for notebook 01's decontamination: docs/evaluation.md#unseen-libraries."""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..downloads import default_cache_dir, pinned_wheel
from ..pins import PackagePin, canonical, package_pins
from .code_trees import every_function
from .decontamination import SetKeys
from .grammars import summary_of
from .offline import CODE_LINES, CODE_TO_CODE, TEXT_TO_CODE, pair_records
from .records import DataError, SkipReport, text_key
from .tree_walk import code_roots, source_files

RECIPES = (TEXT_TO_CODE, CODE_TO_CODE)
NEEDED_FOR = "the unseen-library evaluation, unseen_packages (set it to [] to run without it)"


@dataclass
class MinedPackage:
    """What one package's wheel yields: per recipe the query rows and the whole corpus, and its modules and counts."""

    pin: PackagePin
    modules: tuple[str, ...]
    rows: dict[str, list[dict]]
    corpus: dict[str, list[str]]
    functions: int = 0
    documented: int = 0
    report: SkipReport = field(default_factory=SkipReport)

    def texts(self) -> Iterable[str]:
        for recipe in RECIPES:
            yield from (row["query"] for row in self.rows[recipe])
            yield from self.corpus[recipe]


def _python_members(archive: zipfile.ZipFile) -> list[str]:
    return [name for name in archive.namelist() if name.endswith(".py")
            and not name.split("/", 1)[0].endswith((".dist-info", ".data"))]  # fmt: skip


def _modules(members: Iterable[str]) -> tuple[str, ...]:
    """The top-level import names of a wheel's Python files (`toolz/`, `tlz/`, `tabulate.py` -> tabulate)."""
    return tuple(sorted({PurePosixPath(m).parts[0].removesuffix(".py") for m in members}))


def mine_wheel(pin: PackagePin, wheel: str | Path) -> MinedPackage:
    """Every function of the wheel's Python files as the two recipes' query rows and corpora, or a `DataError`."""
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory(prefix="c2llm-unseen-") as scratch:
        members = _python_members(archive)
        if not members:
            raise DataError(f"unseen package {pin}: its wheel {Path(wheel).name} holds no Python file (a compiled or "
                            "data-only package cannot be mined)")  # fmt: skip
        root = Path(scratch) / f"{pin.name}-{pin.version}"
        for member in members:
            archive.extract(member, root)  # zipfile drops absolute paths and '..' from a member's name
        mined = MinedPackage(pin, _modules(members), {r: [] for r in RECIPES}, {r: [] for r in RECIPES})
        corpus: dict[str, dict[str, None]] = {r: {} for r in RECIPES}  # ordered sets
        try:
            for source in source_files(code_roots([root]), mined.report):
                for function in every_function(source, mined.report) or []:
                    code = function.code.rstrip()
                    summary = summary_of(function.doc, comment=not function.docstring) if function.doc else ""
                    mined.functions += 1
                    mined.documented += bool(summary)
                    if CODE_LINES[0] <= len(code.splitlines()) <= CODE_LINES[1]:
                        corpus[TEXT_TO_CODE][code] = None  # every function is a document, documented or not
                    for row in pair_records(source.file, function.name, "python", summary, code):
                        row.update(start_line=function.start_line)
                        mined.rows[row["dataset"]].append(row)
                        corpus[row["dataset"]][row["positive"]] = None
        except DataError as err:
            raise DataError(f"unseen package {pin}: {err}") from None
    mined.corpus = {recipe: list(texts) for recipe, texts in corpus.items()}
    missing = [recipe for recipe in RECIPES if not mined.rows[recipe]]
    if missing:
        raise DataError(
            f"unseen package {pin}: no {' and no '.join(missing)} query among its {mined.functions} functions "
            f"({mined.documented} with a docstring; a text -> code query needs a docstring summary of 3+ words, a "
            "code -> code query a function of 6+ lines): choose a package with documented functions"
        )
    return mined


def mine_packages(entries: Sequence[str], cache_dir: str | Path | None = None) -> list[MinedPackage]:
    """Each package of `unseen_packages` mined from its pinned wheel (fetched into `<cache>/wheels` when absent)."""
    wheels = Path(cache_dir or default_cache_dir()) / "wheels"
    return [mine_wheel(pin, pinned_wheel(pin.name, pin.version, pin.sha256, wheels, NEEDED_FOR))
            for pin in package_pins(entries)]  # fmt: skip


def source_overlap(mined: MinedPackage, files: Iterable[str]) -> list[str]:
    """The file ids (`<source>/<path>`) under a folder, or a module, named like the package or a top-level module."""
    names = {canonical(n) for n in (mined.pin.name, *mined.modules)}
    found = []
    for file in files:
        parts = PurePosixPath(file).parts
        if names & {canonical(p) for p in (*parts[:-1], PurePosixPath(parts[-1]).stem if parts else "")}:
            found.append(file)
    return found


def unseen_keys(mined: Sequence[MinedPackage], sources: Mapping[str, Iterable[str]] = {}) -> SetKeys:
    """The packages' pins and their tasks' `text_key`s; a `DataError` when a training source holds their files."""
    for name, files in sources.items():
        files = list(files)
        for package in mined:
            hits = source_overlap(package, files)
            if hits:
                raise DataError(
                    f"unseen package {package.pin}: the training source {name} holds {len(hits)} files named like it "
                    f"or its modules ({', '.join(package.modules)}), e.g. {', '.join(hits[:3])}: it is not unseen by "
                    "this run; choose another package (unseen_packages) or another training source"
                )
    keys = frozenset(text_key(text) for package in mined for text in package.texts())
    return SetKeys(tuple(str(package.pin) for package in mined), keys)
