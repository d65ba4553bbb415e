"""Evaluation sets mined from Python libraries no training row came from (section 4.2's protocol on unseen code).

The default run trains on the offline snapshot's train split and is evaluated on its held-out split: other files of
the same two sources (CPython's standard library and lodash, `offline.py`), so a score there can reward learning
those sources. This module mines libraries outside them the CodeSearchNet way, with the repository's one miner
(`code_trees` and `tree_walk`: tree-sitter and its skip rules, test files and folders among them) and its recipes
(`offline.pair_records`, with their length filters):
- text -> code: query = the first paragraph of a function's docstring (`grammars.summary_of`), document = the function
  without its docstring;
- code -> code: query = the first half of a function's lines, document = the rest.
Each package is a whole corpus (`MinedPackage.corpus`): every function it holds is a document, undocumented ones too,
not only the positives of its queries (a text -> code query ranks every function of 2-150 lines, a code -> code query
the second halves of every function of 6-150 lines). `eval.tasks.unseen_tasks` makes two tasks of each package,
`unseen-text2code-<package>` and `unseen-code2code-<package>`.

The packages (`unseen_packages`, a key of notebooks 01 and 04, `pins.package_pins`): a name from `pins.PINNED`, or a pin
"<name> <version> sha256:<hex>" of any other pure-Python wheel on the index. The wheel is fetched once with pip into
the cache (`downloads.pinned_wheel`) and refused when its sha256 is not the pinned one; its `.py` files are unpacked
into a temporary folder, mined and the folder removed. Nothing else is cached: everything derives from the pinned
bytes, and the five pinned packages mine in seconds.

`PINNED`: five pure-Python libraries with docstrings, each of another kind: sorted containers (sortedcontainers),
functional utilities (toolz), text tables (tabulate), human-readable numbers and dates (humanize) and bidirectional
mappings (bidict). None is in the standard library or lodash, the offline snapshot's sources. None is torch or in
torch's dependency closure (filelock, fsspec, Jinja2, MarkupSafe, networkx, setuptools, sympy, mpmath,
typing-extensions, and the packages setuptools vendors: more-itertools, packaging, platformdirs, tomli, zipp,
jaraco.*, ...), which are kept for an independent check. Versions are the newest on PyPI when pinned; each sha256 is
the py3 wheel's, as the index lists it.

Notebook 01 (`unseen_keys`) refuses a run whose training source holds one of the packages (`source_overlap`: a file
of the offline snapshot or of a code root under a folder or module named like the package or one of its top-level
modules) and drops every training row whose query or positive is a query or a document of the packages' tasks
(`decontamination.UNSEEN_TEXT`, "unseen-library text"). Hub and files rows carry no source file to compare, so for
them the text rule alone applies. A package that cannot be fetched, holds no Python file, or yields no text -> code
or no code -> code query is an error naming it.
"""

from __future__ import annotations

import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..downloads import default_cache_dir, pinned_wheel
from ..pins import PackagePin, canonical, package_pins
from .code_trees import every_function
from .decontamination import UnseenKeys
from .grammars import summary_of
from .offline import CODE_LINES, CODE_TO_CODE, TEXT_TO_CODE, pair_records
from .records import DataError, SkipReport, text_key
from .tree_walk import code_roots, source_files

RECIPES = (TEXT_TO_CODE, CODE_TO_CODE)
NEEDED_FOR = "the unseen-library evaluation, unseen_packages (set it to [] to run without it)"


@dataclass
class MinedPackage:
    """What one package's wheel yields: per recipe (`TEXT_TO_CODE`, `CODE_TO_CODE`) the query rows (the records of
    `offline.pair_records`, each with its positive) and the whole corpus (every document, positives included, distinct,
    in source order); and the package's top-level modules, its functions and what the walk skipped."""

    pin: PackagePin
    modules: tuple[str, ...]
    rows: dict[str, list[dict]]
    corpus: dict[str, list[str]]
    functions: int = 0
    documented: int = 0
    report: SkipReport = field(default_factory=SkipReport)

    def texts(self) -> Iterable[str]:
        """Every query and document of the package's tasks."""
        for recipe in RECIPES:
            yield from (row["query"] for row in self.rows[recipe])
            yield from self.corpus[recipe]


def _python_members(archive: zipfile.ZipFile) -> list[str]:
    """The wheel's Python files, its metadata folders (`*.dist-info`, `*.data`) aside."""
    return [name for name in archive.namelist() if name.endswith(".py")
            and not name.split("/", 1)[0].endswith((".dist-info", ".data"))]  # fmt: skip


def _modules(members: Iterable[str]) -> tuple[str, ...]:
    """The top-level import names of a wheel's Python files (`toolz/`, `tlz/`, `tabulate.py` -> tabulate)."""
    return tuple(sorted({PurePosixPath(m).parts[0].removesuffix(".py") for m in members}))


def mine_wheel(pin: PackagePin, wheel: str | Path) -> MinedPackage:
    """Every function of the wheel's Python files (unpacked into a temporary folder that is removed after), as the
    two recipes' query rows and whole corpora; a `DataError` names a package with no Python file, or none left by the
    skip rules, or one that yields no text -> code or no code -> code query."""
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
    """Each package of `unseen_packages` mined from its pinned wheel (in `<cache>/wheels`, fetched there by pip when
    absent; a `downloads.FetchError` names a wheel that cannot be fetched or whose sha256 differs)."""
    wheels = Path(cache_dir or default_cache_dir()) / "wheels"
    return [mine_wheel(pin, pinned_wheel(pin.name, pin.version, pin.sha256, wheels, NEEDED_FOR))
            for pin in package_pins(entries)]  # fmt: skip


def source_overlap(mined: MinedPackage, files: Iterable[str]) -> list[str]:
    """The file ids (`<source>/<path>`) lying under a folder, or being a module, named like the package or one of its
    top-level modules: files of a training source that may hold the package's code."""
    names = {canonical(n) for n in (mined.pin.name, *mined.modules)}
    found = []
    for file in files:
        parts = PurePosixPath(file).parts
        if names & {canonical(p) for p in (*parts[:-1], PurePosixPath(parts[-1]).stem if parts else "")}:
            found.append(file)
    return found


def unseen_keys(mined: Sequence[MinedPackage], sources: Mapping[str, Iterable[str]] = {}) -> UnseenKeys:
    """The packages' pins and the `text_key`s of every query and document of their tasks, for
    `decontamination.UNSEEN_TEXT`; a `DataError` when a training source (`sources`: {what it is: the ids of its
    files}) holds a package's files (`source_overlap`), naming the package, the source and a few of the files."""
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
    return UnseenKeys(tuple(str(package.pin) for package in mined), keys)
