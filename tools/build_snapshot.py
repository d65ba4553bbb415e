"""The builder of the offline snapshot (`c2llm_lib/assets/offline/`, read by `c2llm_lib.data.offline.load_snapshot`):
`python -m tools.build_snapshot STDLIB_DIR LODASH_PACKAGE_DIR` mines a Python installation's standard library and an
unpacked lodash package with CodeSearchNet's recipes (`data.offline.pair_records`), drops duplicate pairs and train
rows that share a text with the test split or HumanEval, and writes the snapshot and its manifest.

No notebook calls it: the snapshot ships with the repository, so this tool lies beside the library (it imports
c2llm_lib, which never imports it). Its function miners are regular expressions over Python's `ast` and lodash's JSDoc
comments, kept here because the shipped snapshot was mined with them and the library's one miner, tree-sitter
(`c2llm_lib.data.grammars`, `code_trees`), gives other rows on the same sources (`compare_miners`,
`python -m tools.build_snapshot --compare STDLIB_DIR LODASH_PACKAGE_DIR`; the counts and reasons are in
docs/data.md, "The offline snapshot"): mining the snapshot with it would change the shipped rows and every figure
measured on them.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
import re
import sys
import textwrap
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from c2llm_lib.data.grammars import BY_EXTENSION, functions, parser_for, summary_of
from c2llm_lib.data.offline import (
    CODE_TO_CODE,
    SNAPSHOT,
    SNAPSHOT_DIR,
    TEST_PERCENT,
    TEXT_TO_CODE,
    first_paragraph,
    humaneval_records,
    pair_records,
)
from c2llm_lib.data.records import text_key

SKIP_DIRS = {"test", "tests", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo", "site-packages",
             "__phello__", "pydoc_data", "venv"}  # fmt: skip
LODASH_VERSION = "4.17.21"


def python_files(root: Path) -> Iterator[Path]:
    """The standard library's Python files the snapshot mines, sorted: no test file, none under `SKIP_DIRS`."""
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root).as_posix()
        if not (SKIP_DIRS & set(rel.split("/")[:-1]) or file.name.startswith("test_")):
            yield file


def python_functions(root: Path) -> Iterator[dict[str, Any]]:
    """Records from every documented function of the Python files under `root` (sorted, deterministic)."""
    for file in python_files(root):
        rel = file.relative_to(root).as_posix()
        try:
            source = file.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or not isinstance(node.body[0], ast.Expr) or len(node.body) < 2:
                continue
            start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            doc_node = node.body[0]
            kept = lines[start - 1 : doc_node.lineno - 1] + lines[doc_node.end_lineno : node.end_lineno]
            code = textwrap.dedent("\n".join(kept))
            yield from pair_records(f"python/{rel}", node.name, "python", first_paragraph(doc), code)


_JSDOC_FUNCTION = re.compile(
    r"/\*\*(?P<doc>(?:(?!\*/).)*)\*/\s*\n(?P<head>function\s+(?P<name>\w+)\s*\([^)]*\)\s*)\{", re.S
)


def _matching_brace(text: str, open_at: int) -> int:
    """Index just past the brace closing the one at `open_at` (strings and comments are rare enough in
    lodash's function bodies that plain counting is right for every file; unbalanced files are skipped)."""
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def jsdoc_summary(doc: str) -> str:
    lines = [re.sub(r"^\s*\*\s?", "", line) for line in doc.splitlines()]
    body = []
    for line in lines:
        if line.strip().startswith("@"):
            break
        body.append(line)
    return first_paragraph("\n".join(body))


def javascript_functions(package: Path) -> Iterator[dict[str, Any]]:
    """Records from the JSDoc-documented functions of a JavaScript package's top-level module files."""
    for file in sorted(package.glob("*.js")):
        text = file.read_text(encoding="utf-8")
        for match in _JSDOC_FUNCTION.finditer(text):
            end = _matching_brace(text, match.end() - 1)
            if end < 0:
                continue
            code = text[match.start("head") : end]
            yield from pair_records(
                f"javascript/lodash/{file.name}", match["name"], "javascript", jsdoc_summary(match["doc"]), code
            )


def tree_sitter_functions(root: Path, files: Iterable[Path], prefix: str, extension: str) -> Iterator[dict[str, Any]]:
    """The same records mined with the library's tree-sitter miner (`grammars.functions`, `summary_of`), file ids
    `prefix` + the path under `root` as the regex miners give them; a file that does not parse is passed over."""
    grammar = BY_EXTENSION[extension]
    parser, _ = parser_for(grammar)
    for file in files:
        data = file.read_bytes()
        tree = parser.parse(data)
        if tree.root_node.has_error:
            continue
        for function in functions(tree, data, grammar, Counter()):
            summary = summary_of(function.doc, comment=not function.docstring)
            path = prefix + file.relative_to(root).as_posix()
            yield from pair_records(path, function.name, grammar.language, summary, function.code)


def compare_miners(stdlib: Path, lodash: Path | None = None) -> dict[str, Any]:
    """The rows (before deduplication) that only the regex miners or only tree-sitter give on the snapshot's sources,
    per language: `rows` (each miner's count), `only_regex` and `only_tree_sitter` (the rows), and `functions`
    (per side, the (file, function) pairs none of whose rows the other miner gives at all)."""
    regex = {"python": list(python_functions(stdlib))}
    tree = {"python": list(tree_sitter_functions(stdlib, python_files(stdlib), "python/", ".py"))}
    if lodash is not None:
        regex["javascript"] = list(javascript_functions(lodash))
        files = sorted(lodash.glob("*.js"))
        tree["javascript"] = list(tree_sitter_functions(lodash, files, "javascript/lodash/", ".js"))
    report: dict[str, Any] = {}
    for language in regex:
        a, b = ([json.dumps(r, sort_keys=True) for r in side[language]] for side in (regex, tree))
        only_a, only_b = Counter(a) - Counter(b), Counter(b) - Counter(a)
        named = [{(r["file"], r["function"]) for r in side[language]} for side in (regex, tree)]
        report[language] = {
            "rows": {"regex": len(a), "tree_sitter": len(b)},
            "only_regex": [json.loads(r) for r in only_a.elements()],
            "only_tree_sitter": [json.loads(r) for r in only_b.elements()],
            "functions": {"only_regex": sorted(named[0] - named[1]), "only_tree_sitter": sorted(named[1] - named[0])},
        }
    return report


def build_snapshot(stdlib: Path, lodash: Path, out_dir: Path = SNAPSHOT_DIR) -> dict[str, Any]:
    """Mines both sources, drops duplicate pairs, writes the snapshot and its manifest; returns the manifest."""
    rows, seen = [], set()
    for row in list(python_functions(stdlib)) + list(javascript_functions(lodash)):
        key = text_key(row["query"]) + text_key(row["positive"])
        if key not in seen:
            seen.add(key)
            rows.append(row)
    # The same text can stand in two files (a copied helper, a common two-line continuation): a train row
    # whose query or positive equals any test or HumanEval text is dropped, so nothing is shared.
    held_out = {
        text_key(t) for r in rows + humaneval_records() if r["split"] == "test" for t in (r["query"], r["positive"])
    }
    leaking = [r for r in rows if r["split"] == "train" and {text_key(r["query"]), text_key(r["positive"])} & held_out]
    dropped = {id(r) for r in leaking}
    rows = [r for r in rows if id(r) not in dropped]
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode()
    with gzip.GzipFile(out_dir / SNAPSHOT.name, "wb", mtime=0) as fh:  # mtime 0: identical bytes every build
        fh.write(payload)
    counts = Counter((r["split"], r["dataset"], r["language"]) for r in rows)
    manifest = {
        "sources": {
            "python": f"CPython {sys.version.split()[0]} standard library (PSF License)",
            "javascript": f"lodash {LODASH_VERSION} from npm (MIT License)",
        },
        "recipes": {
            TEXT_TO_CODE: "first docstring paragraph -> function without docstring",
            CODE_TO_CODE: "first half of the function's lines -> the rest",
        },
        "split": f"by file, sha256(path) % 100 < {TEST_PERCENT} -> test",
        "rows": len(rows),
        "train_rows_dropped_for_sharing_text_with_test_or_humaneval": len(leaking),
        "counts": {"/".join(k): v for k, v in sorted(counts.items())},
        "sha256_uncompressed": hashlib.sha256(payload).hexdigest(),
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    """python -m tools.build_snapshot STDLIB_DIR LODASH_PACKAGE_DIR: rebuild the shipped snapshot; with --compare,
    count the rows that the regex miners and tree-sitter do not share instead."""
    args = sys.argv[1:] if argv is None else argv
    compare = args[:1] == ["--compare"]
    args = args[1:] if compare else args
    if len(args) != 2:
        raise SystemExit("usage: python -m tools.build_snapshot [--compare] STDLIB_DIR LODASH_PACKAGE_DIR")
    if not compare:
        print(json.dumps(build_snapshot(Path(args[0]), Path(args[1])), indent=2))
        return
    for language, found in compare_miners(Path(args[0]), Path(args[1])).items():
        counts = {side: len(found[side]) for side in ("only_regex", "only_tree_sitter")}
        functions = {side: len(names) for side, names in found["functions"].items()}
        print(f"{language}: rows {found['rows']}, rows only one miner gives {counts}, functions {functions}")


if __name__ == "__main__":
    main()
